"""The run spec: one validated object that says what a run is (RLlib's AlgorithmConfig, as data).

A TOML, YAML or JSON file, or built in Python::

    [env]
    id = "CartPole-v1"            # a registered id, "pkg.mod:EnvClass", "pkg.mod:make_env" or "pkg.mod:EnvId"
    num_envs = 4                   # sub-envs per env client (one message carries all)

    [model.config]                 # the default catalog's ModelConfig; or model.module_class = "pkg.mod:MyModule"
    fcnet_hiddens = [64, 64]

    [connectors]                   # built-ins by RLlib's names, the user's by import path; keyword arguments beside
    env_to_module = [{ type = "FrameStackingEnvToModule", num_frames = 4 }]
    learner = [{ type = "FrameStackingLearner", num_frames = 4 }]

    [sampling]
    rollout_fragment_length = 32

    [algorithm]                    # "PPO" (the default), "DQN" or "SAC", and its hyper-parameters
    name = "PPO"
    lr = 0.001

    [multi_agent]                  # only for a multi-agent (PettingZoo) env
    policy_mapping_fn = "per_agent"  # "shared", "per_agent" or "pkg.mod:fn"

The learner owns the spec: it sends it to every server with the weights and writes it into every
checkpoint, so no two processes hold settings that must agree.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rlgate.models.config import ModelConfig
from rlgate.spec.algorithm import ALGORITHMS, AlgorithmConfig, PPOConfig
from rlgate.spec.imports import SpecError, split_path


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _path_if_qualified(value: str) -> str:
    """A name with a ':' is an import path: 'pkg.mod:Name' (SpecError otherwise)."""
    if ":" in value:
        split_path(value)
    return value


#: A built-in's name, or an import path 'pkg.mod:Name'.
NameOrPath = Annotated[str, AfterValidator(_path_if_qualified)]


class _Named(BaseModel):
    """Code a spec names with its keyword arguments: `type` is a built-in's name or 'pkg.mod:Name'; the other
    keys are its keyword arguments."""

    model_config = ConfigDict(extra="allow")

    type: NameOrPath

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def module(self) -> str | None:
        return split_path(self.type)[0] if ":" in self.type else None


class PieceSpec(_Named):
    """One connector piece: `type` is a built-in piece's name or 'pkg.mod:PieceClass'; other keys are its
    keyword arguments (`{ type = "FrameStackingEnvToModule", num_frames = 4 }`)."""


class WrapperSpec(_Named):
    """One env wrapper: `type` is a wrapper of gymnasium.wrappers by name ("AtariPreprocessing") or
    'pkg.mod:Wrapper' (a class or function taking the env first); other keys are its keyword arguments
    (`{ type = "AtariPreprocessing", grayscale_newaxis = true }`)."""


def _names_alone(value: Any) -> Any:
    """A list's bare names as tables: `["MeanStdFilter"]` is `[{ type = "MeanStdFilter" }]`."""
    return [{"type": v} if isinstance(v, str) else v for v in value] if isinstance(value, list) else value


#: A list of named code, where a bare name stands for a table with only its `type`.
Pieces = Annotated[list[PieceSpec], BeforeValidator(_names_alone)]


class EnvSpec(_Section):
    """Which env the clients run (and whose spaces the learner builds the model for)."""

    id: NameOrPath = Field(
        "CartPole-v1",
        description="A registered gymnasium id, 'pkg.mod:EnvClass', 'pkg.mod:make_env' "
        "(a callable returning an env) or 'pkg.mod:EnvId' (importing pkg.mod registers EnvId).",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the env.")
    num_envs: int = Field(1, ge=1, description="Sub-envs per env client; more than one makes a vector env.")
    vectorize: Literal["sync", "async"] = Field(
        "sync", description="How a client's sub-envs run: in its process (sync) or one subprocess each (async)."
    )
    wrappers: Annotated[list[WrapperSpec], BeforeValidator(_names_alone)] = Field(
        default_factory=list,
        description="gymnasium wrappers applied to each env, in order, in the env clients (and wherever the env "
        "is made: its spaces are the wrapped env's). A wrapper of gymnasium.wrappers by name or 'pkg.mod:Wrapper', "
        "its kwargs beside `type`.",
    )
    allow_nonfinite_obs: bool = Field(
        False,
        description="Accept observations holding +-inf where their Box bound is infinite (an env in which infinity "
        "is a meaningful value): `rlgate up` starts its server with --allow-non-finite-obs, and the learner "
        "takes such chunks. NaN observations and non-finite rewards are always rejected.",
    )

    def module(self) -> str | None:
        """The module this env's id names code from, if any."""
        return split_path(self.id)[0] if ":" in self.id else None

    def modules(self) -> list[str | None]:
        """The modules the env and its wrappers name code from (None where one names none)."""
        return [self.module(), *(wrapper.module() for wrapper in self.wrappers)]


class ConnectorsSpec(_Section):
    """The user's pieces of each pipeline, placed where RLlib places custom pieces.

    env_to_module: first, before the default pieces (the module sees what they output). When their output
    is not an observation the default model takes (a Dict, Tuple, Discrete, ...), FlattenObservations is
    appended after them. module_to_env: after the default pieces that make numpy actions per row, before
    NormalizeAndClipActions. learner: first (after PPO's AddOneTsToEpisodesAndTruncate), before the
    default pieces and GAE.
    """

    env_to_module: Pieces = Field(default_factory=list)
    module_to_env: Pieces = Field(default_factory=list)
    learner: Pieces = Field(default_factory=list)


class ModelSpec(_Section):
    """The RLModule: the default catalog's actor-critic, or the user's class (RLlib's RLModuleSpec)."""

    module_class: str | None = Field(
        None, description="'pkg.mod:MyModule', an RLModule subclass; unset: rlgate's default actor-critic."
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="The default catalog's ModelConfig fields (fcnet_hiddens, use_lstm, ...); for a user's "
        "module, whatever it reads from its `model_config` (a dict, as RLlib passes it).",
    )

    def module(self) -> str | None:
        return split_path(self.module_class)[0] if self.module_class else None

    @field_validator("module_class")
    @classmethod
    def _import_path(cls, value: str | None) -> str | None:
        if value is not None:
            split_path(value)
        return value

    @model_validator(mode="after")
    def _catalog_config(self) -> ModelSpec:
        if self.module_class is None:  # validated here, so a bad field fails when the spec is read
            try:
                ModelConfig.from_dict(self.config)
            except ValidationError as exc:
                errors = exc.errors(include_url=False)
                raise ValueError("; ".join(f"model.config.{_dotted(e['loc'])}: {e['msg']}" for e in errors)) from None
        return self


class SamplingSpec(_Section):
    """How servers cut episodes into the chunks they ship (RLlib's env-runner settings)."""

    rollout_fragment_length: int = Field(
        32,
        ge=1,
        description="A running episode is cut and shipped every this many steps (truncate_episodes): short "
        "chunks reach the learner soon after they were sampled, each at the cost of one bootstrap value.",
    )
    batch_mode: Literal["truncate_episodes", "complete_episodes"] = Field(
        "truncate_episodes",
        description="truncate_episodes: ship chunks of rollout_fragment_length steps; complete_episodes: ship "
        "only whole episodes (an env that never ends then never feeds the learner).",
    )
    episode_lookback_horizon: int = Field(
        1, ge=0, description="Steps of lookback a chunk keeps from before its first step (for connectors)."
    )


SHARED = "shared"
PER_AGENT = "per_agent"


class MultiAgentSpec(_Section):
    """A multi-agent run (RLlib's `AlgorithmConfig.multi_agent()`): which module each agent acts with, which
    modules train, and how steps are counted. The env is then a PettingZoo ParallelEnv or AECEnv."""

    policies: list[str] | None = Field(
        None,
        description="The module ids. Unset: 'default_policy' for the shared mapping, the env's agent ids for "
        "per_agent; required with a mapping function of your own.",
    )
    policy_mapping_fn: str = Field(
        SHARED,
        description="Agent id -> module id: 'shared' (every agent acts with one module, 'default_policy'), "
        "'per_agent' (one module per agent, named by its agent id) or 'pkg.mod:fn', a function "
        "(agent_id, episode, **kwargs) -> module id, called once per agent and episode.",
    )
    policies_to_train: list[str] | None = Field(
        None, description="The modules the learner updates; unset: all (the others keep their weights)."
    )
    count_steps_by: Literal["env_steps", "agent_steps"] = Field(
        "env_steps",
        description="What train_batch_size, rollout_fragment_length and the servers' steps per version count: "
        "env steps (one per env.step(), however many agents acted) or agent steps (one per acting agent).",
    )

    @field_validator("policy_mapping_fn")
    @classmethod
    def _builtin_or_path(cls, value: str) -> str:
        if value not in (SHARED, PER_AGENT):
            split_path(value)
        return value

    @model_validator(mode="after")
    def _modules_known(self) -> MultiAgentSpec:
        if self.policy_mapping_fn not in (SHARED, PER_AGENT) and not self.policies:
            raise ValueError("policies: list the module ids your policy_mapping_fn maps agents to")
        if self.policy_mapping_fn == SHARED and self.policies not in (None, ["default_policy"]):
            raise ValueError("policies: the shared mapping has one module, 'default_policy'")
        if self.policies and self.policies_to_train:
            unknown = sorted(set(self.policies_to_train) - set(self.policies))
            if unknown:
                raise ValueError(f"policies_to_train: {unknown} are not in policies {self.policies}")
        return self

    def module(self) -> str | None:
        return split_path(self.policy_mapping_fn)[0] if ":" in self.policy_mapping_fn else None


class RunSpec(_Section):
    """What a run is: env, model, connector pieces, sampling and the algorithm's hyper-parameters."""

    env: EnvSpec = Field(default_factory=EnvSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    connectors: ConnectorsSpec = Field(default_factory=ConnectorsSpec)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    algorithm: AlgorithmConfig = Field(
        default_factory=PPOConfig, description='The algorithm (name = "PPO", "DQN" or "SAC") and its hyper-parameters.'
    )
    multi_agent: MultiAgentSpec | None = Field(
        None, description="Present for a multi-agent env (PettingZoo); absent: a single-agent gymnasium env."
    )
    seed: int | None = Field(None, ge=0, description="Seed of the initial weights, sampling and the envs.")

    @field_validator("algorithm", mode="before")
    @classmethod
    def _ppo_unless_named(cls, value: Any) -> Any:
        """An `[algorithm]` without a name is PPO's (specs from before there were others)."""
        if isinstance(value, dict) and "name" not in value:
            return {**value, "name": "PPO"}
        return value

    @model_validator(mode="after")
    def _wrappers_single_agent(self) -> RunSpec:
        if self.multi_agent is not None and self.env.wrappers:
            raise ValueError(
                "env.wrappers: gymnasium wrappers take a gymnasium env, and a multi-agent run's env is a PettingZoo "
                "env: wrap it in the factory env.id names"
            )
        return self

    @classmethod
    def load(cls, path: Path) -> RunSpec:
        """Read a .toml, .yaml/.yml or .json file; a bad file raises SpecError naming it and the field."""
        return cls.parse(read_spec_file(path), str(path))

    @classmethod
    def parse(cls, data: Any, source: str) -> RunSpec:
        """Validate plain data (a parsed file, or JSON from the wire) into a spec; SpecError says what is wrong."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(_problem(error) for error in exc.errors())
            raise SpecError(f"{source}: {problems}") from None

    def to_json(self) -> str:
        return self.model_dump_json(exclude_defaults=False)

    @classmethod
    def from_json(cls, text: str, source: str) -> RunSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{source}: not JSON: {exc}") from exc
        return cls.parse(data, source)

    def modules(self) -> list[str]:
        """Every module this spec names code from (what a process must be allowed to import)."""
        pieces = [*self.connectors.env_to_module, *self.connectors.module_to_env, *self.connectors.learner]
        named = [*self.env.modules(), self.model.module(), *(p.module() for p in pieces), self._mapping_module()]
        return sorted({name for name in named if name})

    def policy_modules(self) -> list[str]:
        """The modules a server needs (pieces and model; never the env, which runs in the clients)."""
        pieces = [*self.connectors.env_to_module, *self.connectors.module_to_env]
        named = (self.model.module(), *(p.module() for p in pieces), self._mapping_module())
        return sorted({name for name in named if name})

    def _mapping_module(self) -> str | None:
        return self.multi_agent.module() if self.multi_agent else None


def read_spec_file(path: Path) -> dict[str, Any]:
    """The plain data of a .toml, .yaml/.yml or .json spec file (not yet validated)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise SpecError(f"{path}: a run spec is a .toml, .yaml, .yml or .json file")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SpecError(f"{path}: not valid {path.suffix[1:].upper()}: {_parse_error(exc)}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a run spec is a table of sections ([env], [model], ...), not {type(data).__name__}")
    if unknown := unknown_keys(data, RunSpec):
        raise SpecError(f"{path}: {'; '.join(unknown)}")
    return data


def unknown_keys(data: dict[str, Any], model: type[BaseModel], section: tuple[str, ...] = ()) -> list[str]:
    """Each key of a file's data that its section has no field for, as `[env] num_env: unknown key (did you mean
    num_envs?)`: a typo said in the file's terms (pydantic's error would name a flag, and suggest nothing)."""
    keys = _field_keys(model)
    where = f"[{'.'.join(section)}] " if section else ""
    problems = []
    for key, value in data.items():
        if key in keys:
            inner = _section_model(model, keys[key], data) if isinstance(value, dict) else None
            problems += unknown_keys(value, inner, (*section, key)) if inner is not None else []
        elif section == ("algorithm",) and any(key in config.model_fields for config in ALGORITHMS.values()):
            continue  # another algorithm's field: pydantic's error says whose (algorithm_error)
        elif model.model_config.get("extra") == "forbid":
            table = not section and isinstance(value, dict)  # `[algoritm]`: a section of its own
            close = [f"[{c}]" if table else c for c in difflib.get_close_matches(key, keys, n=3)]
            named, what = (f"[{key}]", "unknown section") if table else (key, "unknown key")
            hint = f"did you mean {' or '.join(close)}?" if close else f"it takes: {', '.join(keys)}"
            problems.append(f"{where}{named}: {what} ({hint})")
    return problems


def _field_keys(model: type[BaseModel]) -> dict[str, str]:
    """The keys a section takes (each field's name and aliases) -> the field's name."""
    keys = {}
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if isinstance(alias, str) else []
        keys.update({str(choice): name for choice in (name, *choices)})
    return keys


def _section_model(model: type[BaseModel], name: str, data: dict[str, Any]) -> type[BaseModel] | None:
    """The model whose fields a key's table holds, if it holds a model's: the catalog's ModelConfig for
    model.config unless a module of the user's reads it; a tagged union's member by the table's tag."""
    if model is ModelSpec and name == "config":
        return None if data.get("module_class") else ModelConfig
    field = model.model_fields[name]
    members = [t for t in _types(field.annotation) if isinstance(t, type) and issubclass(t, BaseModel)]
    key = field.discriminator
    if len(members) > 1 and isinstance(key, str):  # pydantic's tag by field name: the table's, else the default's
        tag = data[name].get(key, getattr(field.get_default(call_default_factory=True), key))
        members = [m for m in members if m.model_fields[key].default == tag]
    return members[0] if len(members) == 1 else None


def _types(annotation: Any) -> list[Any]:
    """An annotation and every type inside it (unions, Annotated, generics' arguments)."""
    return [annotation, *(inner for arg in get_args(annotation) for inner in _types(arg))]


def _problem(error: Any) -> str:
    """One validation error as `field.path: message`."""
    error = algorithm_error(error)
    return f"{'.'.join(str(p) for p in error['loc']) or 'spec'}: {error['msg']}"


def algorithm_error(error: Any) -> Any:
    """A pydantic error about `[algorithm]` said for a person: its fields named without the algorithm's tag that
    pydantic puts in their path (algorithm.lr, not algorithm.PPO.lr), a field of another algorithm saying whose it
    is, an unknown algorithm name which there are. Other errors are returned as they are."""
    loc = list(error["loc"])
    at = loc.index("algorithm") if "algorithm" in loc else -1
    if at < 0:
        return error
    message = error["msg"]
    if error["type"] == "union_tag_invalid":
        loc.insert(at + 1, "name")
        tag = error.get("ctx", {}).get("tag")
        message = f"no algorithm {tag!r}: the algorithms are {', '.join(ALGORITHMS)}"
    elif len(loc) > at + 1 and loc[at + 1] in ALGORITHMS:
        name = loc.pop(at + 1)
        field = loc[at + 1] if len(loc) == at + 2 else None
        owners = [other for other, config in ALGORITHMS.items() if field in config.model_fields and other != name]
        if error["type"] == "extra_forbidden" and owners:
            message = f"not a field of {name} (it is {' and '.join(owners)}'s): drop it, or set algorithm.name"
    return {**error, "loc": tuple(loc), "msg": message}


def _parse_error(error: Exception) -> str:
    """A parser's error as one line: YAML's own message quotes the text with a caret under it."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(error).split())


def _dotted(loc: tuple[str | int, ...]) -> str:
    """('fcnet_hiddens', 0) -> 'fcnet_hiddens[0]'."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
