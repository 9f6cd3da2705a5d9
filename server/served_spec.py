"""Which run spec a server serves before any weights come, from its settings alone: the operator's (--config,
--env, or one given in Python), the learner's given in advance, or none yet (a checkpoint's, the learner's). Read
before the server's imports (server/command.py), so a mistake in it is answered at once."""

from __future__ import annotations

from rlgate.server.settings import ServerSettings
from rlgate.spec.imports import SpecError
from rlgate.spec.run import RunSpec


def served_spec(settings: ServerSettings, given: RunSpec | None) -> RunSpec | None:
    """The run spec this server knows before any weights come: None with --checkpoint (the checkpoint's), or with
    --learner and no --config (the learner's weights bring it); else the operator's own (`given` in Python, or
    --config's), whose code may be imported. SpecError for flags that contradict each other."""
    s = settings
    if s.checkpoint and (given or s.config or s.env):
        raise SpecError(
            "--config and --env describe a fresh model: a server with --checkpoint serves the checkpoint's run spec"
        )
    if s.learner and s.env:
        raise SpecError(
            "--env describes a fresh model: a server with --learner serves the run spec that comes with the "
            "learner's weights (--config may give that spec in advance, to serve its version 0 at once)"
        )
    if s.checkpoint:
        return None
    if s.learner:
        return _learners_spec(s, given) if given or s.config else None
    return _standalone_spec(s, given)


def _standalone_spec(s: ServerSettings, given: RunSpec | None) -> RunSpec:
    """The run spec of a fresh model: the one given in Python, else --config's, with --env and --seed.
    Its env is built (for its spaces) only when one is named; else the first session's spaces count."""
    spec = given or (RunSpec.load(s.config) if s.config else RunSpec())
    if s.env:
        spec = spec.model_copy(update={"env": spec.env.model_copy(update={"id": s.env})})
    if spec.seed is None and s.seed is not None:
        spec = spec.model_copy(update={"seed": s.seed})
    return spec


def _learners_spec(s: ServerSettings, given: RunSpec | None) -> RunSpec:
    """The learner's run spec, given in advance (`rlgate up` does): its version 0 is a fresh model of it,
    built alike here and in the learner from the spec's seed, so this server serves it at once instead of
    waiting for the learner's first weights, which then must come with the same spec (else it refuses them).
    A spec without a seed would give the two other weights: SpecError."""
    if given is None:
        assert s.config is not None  # the caller has a spec or a --config
        given = RunSpec.load(s.config)
    spec = given
    if spec.seed is None:
        raise SpecError(
            "--config with --learner: the run spec needs a seed, so that this server's version 0 is the "
            "learner's (or leave --config out: the server then waits for the learner's weights)"
        )
    return spec
