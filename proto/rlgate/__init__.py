"""rlgate: serve reinforcement-learning policies to remote environments over gRPC, and train them.

The repository keeps one folder per room and the build maps each into this package (pyproject.toml,
`[tool.setuptools.package-dir]`): `core/` is `rlgate.core`, `episodes/` is `rlgate.episodes`, and so on;
this folder (`proto/rlgate`) is the package itself, with the wire contract's stubs in `rlgate.v1`.
Layers, each importing only from those below it (tests/test_layers.py checks):
v1 <- core <- episodes <- connectors, models <- spec, service <- server, learner, client <- bench <- cli.
"""
