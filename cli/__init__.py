"""The `rlgate` command line: one subcommand per service, and `rlgate up` (all of them locally)."""
