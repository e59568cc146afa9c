"""The ``lorabench`` command line: one module per subcommand, ``main`` parses and dispatches."""
