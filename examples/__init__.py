"""Runnable run-spec examples: each `*.toml` names code in the modules beside it (see README.md)."""
