"""ConnectorV2: one piece of a connector pipeline (RLlib's new-API-stack ConnectorV2)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

import gymnasium as gym
import numpy as np

from rlgate.connectors.batching import BatchedNdArray, batch_items, is_batched
from rlgate.core.tree import map_structure, unbatch
from rlgate.episodes.multi_agent_episode import MultiAgentEpisode

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


def episode_key(episode: SingleAgentEpisode) -> tuple:
    """The key a single-agent episode's items sit under in a batch column: (id,) or (ma id, agent, module)."""
    if episode.agent_id is not None:
        return (episode.multi_agent_episode_id, episode.agent_id, episode.module_id)
    return (episode.id_,)


def is_multi_agent(episodes: Any) -> TypeIs[Sequence[MultiAgentEpisode]]:
    """Whether `episodes` are MultiAgentEpisodes (checked on a list's first item; the server's column-stored
    single-agent rows, `EpisodeRows`, are never multi-agent and are not asked, which would build an episode)."""
    return isinstance(episodes, list | tuple) and bool(episodes) and isinstance(episodes[0], MultiAgentEpisode)


def is_multi_rl_module(rl_module: Any) -> bool:
    """Whether `rl_module` is a MultiRLModule (a Mapping of module id -> RLModule): its batches are
    `{module_id: {column: data}}`."""
    return isinstance(rl_module, Mapping)


def make_episode_keys_unique(episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode]) -> None:
    """Append `_<position>` to the id of each (agent's) single-agent episode whose id has no "_" yet (RLlib
    2.60's rule).

    Per-episode columns are keyed by episode id, so two chunks of one episode in a train batch would
    otherwise be mixed into one list. RLlib's learner AddObservationsFromEpisodesToBatch renames this
    way; PPO's AddOneTsToEpisodesAndTruncate, first in its pipeline, has already given every id a
    suffix, so this renames nothing there. An id that already holds a "_" is left alone (as in RLlib;
    rlgate's ids are uuid hex, without one). A user learner piece that adds per-episode items before
    these pieces should call it first.

    Agents' episodes are keyed by their multi-agent episode's id. Given MultiAgentEpisodes, that id stays (as
    in RLlib, so two chunks of one multi-agent episode share their agents' keys). Given agents' episodes
    without their MultiAgentEpisode (rlgate's learner gets them so), it is renamed too (`_<position>`), as no
    MultiAgentEpisode holds them apart.
    """
    bare_agents = not is_multi_agent(episodes)
    for position, episode in enumerate(ConnectorV2.single_agent_episode_iterator(episodes, False)):
        if "_" not in episode.id_:
            episode.id_ = f"{episode.id_}_{position}"
        ma_id = episode.multi_agent_episode_id
        if bare_agents and episode.agent_id is not None and ma_id is not None and "_" not in ma_id:
            episode.multi_agent_episode_id = f"{episode.multi_agent_episode_id}_{position}"


class ConnectorV2(abc.ABC):
    """Transforms a batch (a dict of columns) on its way between env and module, or into the learner.

    A piece reads the running `episodes` (and may write back into them, e.g. a filtered observation, so
    that the learner sees it too) and returns the batch. A column holds, before BatchIndividualItems,
    either a dict `(episode id,) -> [item, ...]` (the per-episode path, filled with `add_batch_item`) or
    an already batched array `[B, ...]` (possibly nested dicts/tuples of arrays; the batched fast path,
    see `connectors/__init__.py`).

    Spaces: setting `input_observation_space` or `input_action_space` recomputes both output spaces
    (`observation_space`, `action_space`) with `recompute_output_observation_space(in_obs, in_act)` and
    `recompute_output_action_space(in_obs, in_act)`; override those when the piece changes a space.
    An output space is None while its input space is None.
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        as_learner_connector: bool = False,
        **kwargs: Any,
    ) -> None:
        # Pieces used in both the env-to-module and the learner pipeline (RLlib's `as_learner_connector`)
        # read this to choose their learner behaviour; the others ignore it.
        self._as_learner_connector = as_learner_connector
        self._set_input_spaces(input_observation_space, input_action_space)

    @property
    def name(self) -> str:
        """The piece's name in a pipeline (its class name): its anchor, its timings' key and its state's
        key (`Name#2`, ... for a repeated name, see `ConnectorPipelineV2.state_keys`)."""
        return type(self).__name__

    # --- spaces -----------------------------------------------------------------------------------------

    @property
    def input_observation_space(self) -> gym.Space | None:
        return self._input_observation_space

    @input_observation_space.setter
    def input_observation_space(self, value: gym.Space | None) -> None:
        self._input_observation_space = value
        self._recompute_spaces()

    @property
    def input_action_space(self) -> gym.Space | None:
        return self._input_action_space

    @input_action_space.setter
    def input_action_space(self, value: gym.Space | None) -> None:
        self._input_action_space = value
        self._recompute_spaces()

    @property
    def observation_space(self) -> gym.Space | None:
        """The observation space after this piece."""
        return self._observation_space

    @property
    def action_space(self) -> gym.Space | None:
        """The action space after this piece."""
        return self._action_space

    def _set_input_spaces(self, observation_space: gym.Space | None, action_space: gym.Space | None) -> None:
        """Set both input spaces, then recompute the output spaces once (what a pipeline does per piece)."""
        self._input_observation_space = observation_space
        self._input_action_space = action_space
        self._recompute_spaces()

    def _recompute_spaces(self) -> None:
        in_obs, in_act = self._input_observation_space, self._input_action_space
        self._observation_space = None if in_obs is None else self.recompute_output_observation_space(in_obs, in_act)
        self._action_space = None if in_act is None else self.recompute_output_action_space(in_obs, in_act)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        """The observation space after this piece; override when the piece changes observations."""
        return input_observation_space

    def recompute_output_action_space(
        self, input_observation_space: gym.Space | None, input_action_space: gym.Space
    ) -> gym.Space:
        """The action space after this piece; override when the piece changes actions."""
        return input_action_space

    # --- the call ---------------------------------------------------------------------------------------

    #: Whether this piece may be called with a batch whose OBS already holds the episodes' latest observations
    #: as one [B, ...] array (the batched fast path: a step message or a vector env holds them so), and keeps
    #: that OBS equal to what it writes into the episodes. The built-in env-to-module pieces say True. A piece
    #: that does not say so (a user's piece written RLlib's way: it rewrites the episodes' latest observation
    #: and leaves OBS to AddObservationsFromEpisodesToBatch) makes its pipeline run from an empty batch, as
    #: RLlib's EnvRunner runs it, so the module sees what the piece wrote. See `takes_batched_obs`.
    accepts_batched_obs: bool = False

    def takes_batched_obs(self) -> bool:
        """`accepts_batched_obs` as the class that defines this piece's `__call__` (or a subclass of it) says: a
        subclass that overrides `__call__` without saying so again does not inherit the promise."""
        for klass in type(self).__mro__:
            if "accepts_batched_obs" in vars(klass):
                return bool(vars(klass)["accepts_batched_obs"])
            if "__call__" in vars(klass):
                return False
        return False

    @abc.abstractmethod
    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: Sequence[Any],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Transform `batch` (in place or into a new dict) and return it.

        `episodes` are SingleAgentEpisodes (a list, or the server's column-stored EpisodeRows), or
        MultiAgentEpisodes in a multi-agent pipeline (pieces see their agents through
        `single_agent_episode_iterator`).

        `shared_data` passes context between pieces and from env-to-module to module-to-env;
        `metrics` is a plain dict that pipelines add per-piece seconds to.
        """

    # --- state ------------------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """This piece's state ({} for a stateless piece)."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a state from `get_state()` or `merge_states()` (nothing to do when stateless)."""
        return

    def reset_state(self) -> None:
        """Reset the state to its initial value (a stateless piece has nothing to reset)."""
        return

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """Merge the states of copies of this piece (e.g. on several servers) into one state."""
        return {}

    def check_state(self, state: Any) -> None:
        """Raise ValueError unless `state` fits this piece: one that came from elsewhere (a server's, over the
        wire) before it is merged or set. A piece whose state travels overrides it (structure, shapes, dtypes,
        values its merge_states and set_state take); this one takes any state."""
        return

    # --- helpers for per-episode pieces -----------------------------------------------------------------

    @overload
    @staticmethod
    def single_agent_episode_iterator(
        episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode],
        agents_that_stepped_only: bool = True,
        zip_with_batch_column: None = None,
    ) -> Iterator[SingleAgentEpisode]: ...

    @overload
    @staticmethod
    def single_agent_episode_iterator(
        episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode],
        agents_that_stepped_only: bool,
        zip_with_batch_column: Any,
    ) -> Iterator[tuple[SingleAgentEpisode, Any]]: ...

    @overload
    @staticmethod
    def single_agent_episode_iterator(
        episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode],
        agents_that_stepped_only: bool = True,
        *,
        zip_with_batch_column: Any,
    ) -> Iterator[tuple[SingleAgentEpisode, Any]]: ...

    @staticmethod
    def single_agent_episode_iterator(
        episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode],
        agents_that_stepped_only: bool = True,
        zip_with_batch_column: Any = None,
    ) -> Iterator[SingleAgentEpisode | tuple[SingleAgentEpisode, Any]]:
        """Yield the episodes (MultiAgentEpisodes as their agents' episodes), or (episode, item) pairs with
        `zip_with_batch_column`.

        `zip_with_batch_column` is a column's data: a list (one item per episode), a dict
        `(episode id,) -> [items]` or `(multi-agent episode id, agent id, module id) -> [items]` (each episode
        takes its next item), or a batched array (row i belongs to episodes[i]). With
        `agents_that_stepped_only`, a MultiAgentEpisode yields only the agents that observed at its latest
        env step (`get_agents_that_stepped()`), else all its agents.
        """
        if is_multi_agent(episodes):
            episodes = [
                ma_episode.agent_episodes[agent_id]
                for ma_episode in episodes
                for agent_id in (
                    sorted(ma_episode.get_agents_that_stepped(), key=str)
                    if agents_that_stepped_only
                    else ma_episode.agent_episodes
                )
            ]
        if zip_with_batch_column is None:
            yield from episodes
            return
        if isinstance(zip_with_batch_column, list) or is_batched(zip_with_batch_column):
            rows = zip_with_batch_column
            if not isinstance(rows, list | np.ndarray):
                rows = unbatch(rows)
            if len(rows) != len(episodes):
                raise ValueError(f"zip_with_batch_column has {len(rows)} items but there are {len(episodes)} episodes")
            yield from zip(episodes, rows, strict=True)
            return
        positions: dict[tuple, int] = {}
        for episode in episodes:
            key = episode_key(episode)
            position = positions.get(key, 0)
            positions[key] = position + 1
            yield episode, zip_with_batch_column[key][position]

    @staticmethod
    def add_batch_item(
        batch: dict[str, Any],
        column: str,
        item_to_add: Any,
        single_agent_episode: SingleAgentEpisode | None = None,
    ) -> None:
        """Append one item to `column`: to a plain list, or under the episode's key if one is given."""
        if single_agent_episode is None:
            batch.setdefault(column, []).append(item_to_add)
            return
        batch.setdefault(column, {}).setdefault(episode_key(single_agent_episode), []).append(item_to_add)

    @staticmethod
    def add_n_batch_items(
        batch: dict[str, Any],
        column: str,
        items_to_add: Any,
        num_items: int,
        single_agent_episode: SingleAgentEpisode | None = None,
    ) -> None:
        """Append a list of `num_items` items, or one already batched (nested) array of `num_items` rows.

        A batched array is kept whole (tagged as BatchedNdArray), so BatchIndividualItems concatenates it
        instead of stacking it: much cheaper than splitting it into rows.
        """
        if isinstance(items_to_add, list):
            if len(items_to_add) != num_items:
                raise ValueError(f"num_items is {num_items} but {len(items_to_add)} items were given")
            for item in items_to_add:
                ConnectorV2.add_batch_item(batch, column, item, single_agent_episode)
            return
        tagged = map_structure(lambda a: np.asarray(a).view(BatchedNdArray), items_to_add)
        ConnectorV2.add_batch_item(batch, column, tagged, single_agent_episode)

    @staticmethod
    def foreach_batch_item_change_in_place(
        batch: dict[str, Any],
        column: str | list[str] | tuple[str, ...],
        func: Callable[[Any, Any, Any, Any], Any],
    ) -> None:
        """Replace every item of one or more columns by `func(item_or_items, eps_id, agent_id, module_id)`.

        With several columns `func` gets and returns a tuple of items. Items are the list entries of a
        column, or the rows of a batched column (eps_id is then None; the rows are stacked again after).
        """
        columns = [column] if isinstance(column, str) else list(column)
        missing = [c for c in columns if c not in batch]
        if missing:
            raise ValueError(f"column(s) {missing} not in the batch (it has {list(batch)})")
        single = isinstance(column, str)

        def apply(containers: list[Any], ids: tuple) -> None:
            for pos, items in enumerate(zip(*containers, strict=True)):
                results = func(items[0] if single else items, *ids)
                for container, result in zip(containers, (results,) if single else results, strict=True):
                    container[pos] = result

        if is_batched(batch[columns[0]]):
            rows = [unbatch(batch[c]) for c in columns]
            apply(rows, (None, None, None))
            for c, column_rows in zip(columns, rows, strict=True):
                batch[c] = batch_items(column_rows)
        elif isinstance(batch[columns[0]], list):
            apply([batch[c] for c in columns], (None, None, None))
        else:
            for key in batch[columns[0]]:
                eps_id, agent_id, module_id = key if len(key) == 3 else (key[0], None, None)
                apply([batch[c][key] for c in columns], (eps_id, agent_id, module_id))

    def __str__(self) -> str:
        return self.name
