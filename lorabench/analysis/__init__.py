"""What is concluded from results: compare two runs, the report page, which configuration
to choose."""
