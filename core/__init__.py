"""The core vocabulary every other layer speaks: column names, tree and space helpers, the wire codec.

Nothing here imports from the rest of rlgate (only from the generated `rlgate.v1` stubs).
"""
