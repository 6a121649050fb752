"""One module per `t2sql` subcommand, named after it: each has `add_arguments(parser)` and `run(args)`."""
