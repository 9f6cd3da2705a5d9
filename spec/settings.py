"""The run spec as settings: a spec file (`--config`), and every field of it also a flag or variable.

`rlgate learn --config run.toml --spec.algorithm.lr 3e-4` reads run.toml, then sets one field on top;
`RLGATE_SPEC__SAMPLING__ROLLOUT_FRAGMENT_LENGTH=32` does the same from the environment. `--env` and
`--seed` are shorthands for `--spec.env.id` and `--spec.seed`. Precedence, highest first: flags,
environment variables, the file, the env's preset (spec/presets/, `--preset none` to start from the
defaults), the spec's defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings

from rlgate.spec.presets import ALGORITHM, preset, preset_for
from rlgate.spec.run import RunSpec, read_spec_file


class SpecSettings(BaseSettings):
    """Settings fields that say what the run is (mixed into a process's settings).

    Put it first among a settings class's bases: pydantic takes the last base's model_config, and this
    class leaves the process's own (env prefix, flag style) to the others. Subclasses may add shorthand
    fields (`SHORTHANDS`: field -> the spec field it sets) and a `DEFAULT_SPEC`, the command's own defaults
    (under the preset, the file and the flags).
    """

    SHORTHANDS: ClassVar[dict[str, tuple[str, ...]]] = {
        "env": ("env", "id"),
        "seed": ("seed",),
        "algo": ("algorithm", "name"),
    }
    DEFAULT_SPEC: ClassVar[dict[str, Any]] = {}

    config: Path | None = Field(
        None,
        description="Run spec file (.toml, .yaml or .json): env, model, connector pieces, sampling, algorithm. "
        "Code it names may be imported by this process: it is its operator's choice.",
    )
    env: str | None = Field(None, description="Shorthand for --spec.env.id: the env to run (see the spec's env.id).")
    algo: str | None = Field(None, description="Shorthand for --spec.algorithm.name: PPO (the default), DQN or SAC.")
    preset: str = Field(
        "auto",
        description="Run spec the file and flags start from: 'auto' (the preset of the env and algorithm if there is "
        "one: tuned PPO settings for CartPole-v1, Acrobot-v1, Pendulum-v1, LunarLander-v3, MountainCar-v0, "
        "MountainCarContinuous-v0, MiniGrid-Empty-5x5-v0 and, as 'ALE', every ALE/ game; DQN for CartPole-v1, "
        "Acrobot-v1, LunarLander-v3; SAC for Pendulum-v1, LunarLanderContinuous-v3, MountainCarContinuous-v0), one "
        "of those names, or 'none'.",
    )  # once read: the preset that applied, or "none"
    seed: int | None = Field(None, description="Shorthand for --spec.seed.")
    spec: RunSpec = Field(
        default_factory=RunSpec,
        description="The run spec; each of its fields is also a flag (--spec.algorithm.lr) and a variable "
        "(RLGATE_SPEC__ALGORITHM__LR), over the --config file.",
    )

    @model_validator(mode="before")
    @classmethod
    def _file_under_flags(cls, data: Any) -> Any:
        """The --config file is the base; fields set by flags or variables go on top of it."""
        if not isinstance(data, dict):
            return data
        given = data.get("spec")
        overrides = given.model_dump(exclude_unset=True) if isinstance(given, RunSpec) else dict(given or {})
        for field, path in cls.SHORTHANDS.items():
            if data.get(field) is not None:
                overrides = _deep_merge(_nested(path, data[field]), overrides)
        file = read_spec_file(Path(data["config"])) if data.get("config") else {}
        name = data.get("preset", "auto")
        # The env and algorithm named (by a flag, the file or this command's default) choose the preset.
        named = _deep_merge(_deep_merge(cls.DEFAULT_SPEC, file), overrides)
        given = named.get("algorithm")
        algorithm = given.get("name", ALGORITHM) if isinstance(given, dict) else ALGORITHM
        if name == "auto":
            env_id = (named.get("env") or {}).get("id")
            name = (preset_for(env_id, algorithm) if isinstance(env_id, str) else None) or "none"
        merged: dict[str, Any] = {}
        for layer in (cls.DEFAULT_SPEC, preset(name, algorithm) if name != "none" else {}, file, overrides):
            merged = _deep_merge(merged, layer)
        return {**data, "preset": name, "spec": merged}

    def preset_line(self) -> str:
        """Which preset the run spec starts from, for the start-up log: without one, whatever the file and flags
        leave unset is the spec's default, tuned for CartPole, which may not suit the env."""
        if self.preset != "none":
            return f"run spec: the {self.preset} preset (settings tuned for it), with the file and flags over it"
        return (
            f"run spec: no preset for {self.spec.env.id}: what the file and flags leave unset is the spec's default "
            f"(the algorithm's, tuned for CartPole-v1; env.num_envs {self.spec.env.num_envs})"
        )

    def spec_given(self) -> bool:
        """Whether anything said what the run is (a file, a shorthand or a spec field), beyond the defaults."""
        # model_validator's descriptor hides the classmethod from mypy (it is callable at run time).
        defaults = self._file_under_flags({})["spec"]  # type: ignore[operator]
        return self.config is not None or self.spec != RunSpec.model_validate(defaults)


def _nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """("env", "id"), "X" -> {"env": {"id": "X"}}."""
    for key in reversed(path):
        value = {key: value}
    return value


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
