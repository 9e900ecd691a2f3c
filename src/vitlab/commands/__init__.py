"""One module per ``vitlab`` sub-command; each defines ``add_parser(subparsers, formatter)``."""
