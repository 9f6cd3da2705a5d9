"""ConnectorPipelineV2: connector pieces run one after the other; itself a ConnectorV2, so pipelines nest."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from rlgate.connectors.connector_v2 import ConnectorV2

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule

Anchor = str | type


class ConnectorPipelineV2(ConnectorV2):
    """An editable sequence of connector pieces (RLlib's ConnectorPipelineV2, stricter where RLlib is lax).

    - Editing: `append`, `prepend`, `insert_before`, `insert_after` and `remove` find an anchor piece by
      class or class name (the first such piece, as in RLlib) and raise ValueError when there is none
      (RLlib 2.60 silently appends). A pipeline may hold several pieces of one class (as RLlib's may).
    - Indexing, as RLlib: `pipeline[i]` is the piece at position i, `pipeline[Class]` the list of pieces of that
      class or a subclass ([] when none). `pipeline["Name"]` is the first piece of that name (KeyError when
      absent): RLlib 2.60 means it to be the list of them, but raises AttributeError (its pieces have no `name`).
    - A piece that returns something other than a dict raises ValueError (as RLlib's).
    - Spaces: the input spaces flow through every piece (re-propagated after each edit); the pipeline's
      output spaces are those of its last piece.
    - State: `get_state()` is `{piece key: piece state}` for the stateful pieces; `set_state` and
      `merge_states` pair states with pieces by that key (never by position). A piece's key is its name,
      and for a second, third, ... piece of the same name `Name#2`, `Name#3`, ... (`state_keys()`). Deliberate
      difference: RLlib 2.60 keys by class name alone, so with two pieces of one class its `get_state`
      keeps only the last one's state, `set_state` gives that one state to both, and its `merge_states`
      pairs the i-th entry of the first state with the i-th piece (also wrong when a stateless piece
      comes first). Here each piece's state (MeanStdFilter's statistics, which travel between servers
      and learner by this state) round-trips and merges with its own; without repeated names the state
      is RLlib's.
    - Timing: when `metrics` (a plain dict) is given, each call adds the seconds spent in each piece to
      `metrics[piece name]`: pieces of one name add into one entry, as RLlib's timers are per class (a
      nested pipeline adds its total under its own name, and its pieces' times under theirs).
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        connectors: list[ConnectorV2] | None = None,
        **kwargs: Any,
    ) -> None:
        self.connectors: list[ConnectorV2] = []
        for connector in connectors or []:
            _check_piece(connector)
            self.connectors.append(connector)
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: Sequence[SingleAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        shared_data = {} if shared_data is None else shared_data
        timed = metrics is not None
        for connector in self.connectors:
            start = time.perf_counter() if timed else 0.0
            batch = connector(
                rl_module=rl_module,
                batch=batch,
                episodes=episodes,
                explore=explore,
                shared_data=shared_data,
                metrics=metrics,
                **kwargs,
            )
            if metrics is not None:
                metrics[connector.name] = metrics.get(connector.name, 0.0) + time.perf_counter() - start
            if not isinstance(batch, dict):
                raise ValueError(
                    f"{connector.name} returned {type(batch).__name__}, not the batch dict: its __call__ must return "
                    "the `batch` it was given (changed or not)"
                )
        return batch

    def takes_batched_obs(self) -> bool:
        """Whether every piece takes a batched OBS (see ConnectorV2.accepts_batched_obs)."""
        return all(connector.takes_batched_obs() for connector in self.connectors)

    # --- editing ----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.connectors)

    def __getitem__(self, key: int | Anchor) -> ConnectorV2 | list[ConnectorV2]:
        """The piece at position `key`; the list of pieces of class `key` or a subclass; the first piece named `key`."""
        if isinstance(key, int):
            return self.connectors[key]
        if isinstance(key, type):
            return [connector for connector in self.connectors if isinstance(connector, key)]
        if isinstance(key, str):
            return self.connectors[self._index(key, error=KeyError)]
        raise NotImplementedError(f"a pipeline is indexed by position, class or name, not by {type(key).__name__}")

    def append(self, connector: ConnectorV2) -> None:
        """Add `connector` at the end."""
        self._insert(len(self.connectors), connector)

    def prepend(self, connector: ConnectorV2) -> None:
        """Add `connector` at the start."""
        self._insert(0, connector)

    def insert_before(self, name_or_class: Anchor, connector: ConnectorV2) -> ConnectorV2:
        """Insert `connector` before the piece `name_or_class`, and return that piece."""
        index = self._index(name_or_class)
        self._insert(index, connector)
        return self.connectors[index + 1]

    def insert_after(self, name_or_class: Anchor, connector: ConnectorV2) -> ConnectorV2:
        """Insert `connector` after the piece `name_or_class`, and return that piece."""
        index = self._index(name_or_class)
        self._insert(index + 1, connector)
        return self.connectors[index]

    def remove(self, name_or_class: Anchor) -> ConnectorV2:
        """Remove the piece `name_or_class` and return it."""
        removed = self.connectors.pop(self._index(name_or_class))
        self._propagate_spaces()
        return removed

    def _index(self, name_or_class: Anchor, error: type[Exception] = ValueError) -> int:
        for index, connector in enumerate(self.connectors):
            if connector.name == name_or_class or type(connector) is name_or_class:
                return index
        raise error(f"no connector piece {name_or_class!r} in the pipeline ({self._names()})")

    def _insert(self, index: int, connector: ConnectorV2) -> None:
        _check_piece(connector)
        self.connectors.insert(index, connector)
        self._propagate_spaces()

    def _names(self) -> str:
        return " -> ".join(c.name for c in self.connectors) or "empty"

    # --- spaces -----------------------------------------------------------------------------------------

    def _recompute_spaces(self) -> None:
        self._propagate_spaces()

    def _propagate_spaces(self) -> None:
        obs_space, act_space = self.input_observation_space, self.input_action_space
        for connector in self.connectors:
            connector._set_input_spaces(obs_space, act_space)
            obs_space, act_space = connector.observation_space, connector.action_space
        self._observation_space, self._action_space = obs_space, act_space

    # --- state ------------------------------------------------------------------------------------------

    def state_keys(self) -> list[str]:
        """Each piece's key, in order: its name, or `Name#k` for the k-th piece of a repeated name."""
        seen: dict[str, int] = {}
        keys = []
        for connector in self.connectors:
            count = seen[connector.name] = seen.get(connector.name, 0) + 1
            keys.append(connector.name if count == 1 else f"{connector.name}#{count}")
        return keys

    def get_state(self) -> dict[str, Any]:
        states = {key: c.get_state() for key, c in zip(self.state_keys(), self.connectors, strict=True)}
        return {key: state for key, state in states.items() if state}

    def set_state(self, state: dict[str, Any]) -> None:
        pieces = dict(zip(self.state_keys(), self.connectors, strict=True))
        unknown = [key for key in state if key not in pieces]
        if unknown:
            raise KeyError(f"no connector piece {', '.join(map(repr, unknown))} in the pipeline ({self._names()})")
        for key, piece_state in state.items():
            pieces[key].set_state(piece_state)

    def reset_state(self) -> None:
        for connector in self.connectors:
            connector.reset_state()

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        merged = {}
        for key, connector in zip(self.state_keys(), self.connectors, strict=True):
            piece_states = [state[key] for state in states if key in state]
            if piece_states:
                merged[key] = connector.merge_states(piece_states)
        return merged

    def check_state(self, state: Any) -> None:
        """Raise ValueError unless `state` is `{piece key: piece state}` of this pipeline's pieces, each one
        fitting its piece (`check_state`); pieces may be left out, as merge_states and set_state allow."""
        if not isinstance(state, Mapping):
            raise ValueError(f"a pipeline state is a dict by piece key, not {type(state).__name__}")
        pieces = dict(zip(self.state_keys(), self.connectors, strict=True))
        unknown = [key for key in state if key not in pieces]
        if unknown:
            raise ValueError(f"no connector piece {', '.join(map(repr, unknown))} in the pipeline ({self._names()})")
        for key, piece_state in state.items():
            try:
                pieces[key].check_state(piece_state)
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from exc

    def __str__(self) -> str:
        return f"{self.name}({self._names()})"


def _check_piece(connector: Any) -> None:
    if not isinstance(connector, ConnectorV2):
        raise TypeError(f"a pipeline holds ConnectorV2 pieces, not {type(connector).__name__}")
