"""The commands of the command line, one module per group, each registering its own (``add_parsers``)."""
