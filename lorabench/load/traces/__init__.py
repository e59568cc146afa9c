"""Real traces: imported from public datasets (``lorabench trace import``), read back as
compact arrays, described (``lorabench trace stats``) and cut into replay windows.

- ``data``: the trace file, both versions, as arrays; writing an imported one.
- ``files``: a trace file written whole or not at all.
- ``sources``: the datasets' formats, read row by row.
- ``transforms``: window, drop, clip, time scale and adapter labels.
- ``importer``: a source file through the transforms into a trace file.
- ``summary``: the text of ``lorabench trace stats``.
- ``command``: the ``lorabench trace`` subcommands.
"""
