"""Micro benchmarks: each module has run() -> dict and runs as `python -m rlgate.bench.<module>`."""
