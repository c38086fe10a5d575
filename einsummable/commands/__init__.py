"""One module per CLI subcommand; each defines `add_arguments(parser)` and `main(args) -> int`."""
