"""The default pipelines on multi-agent episodes: batches keyed by (episode, agent, module), one per module.

The structure checked here is RLlib 2.60's: AgentToModuleMapping turns `{column: {(eps id, agent id, module id):
[items]}}` into `{module id: {column: ...}}` keeping only agents that are to act, module-to-env hands back one
`{agent id: action}` dict per episode, and the learner pipeline (GAE included) works per module.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.connectors.builders import (
    build_env_to_module_pipeline,
    build_learner_pipeline,
    build_module_to_env_pipeline,
)
from rlgate.core.columns import Columns
from rlgate.episodes import MultiAgentEpisode
from rlgate.models import MultiRLModule, build_module
from rlgate.spec.run import RunSpec

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Discrete(2)
BOX_ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
AGENTS = {"a": (OBS, ACT), "b": (OBS, BOX_ACT)}
MODULES = {"p_a": (OBS, ACT), "p_b": (OBS, BOX_ACT)}
AGENT_OBS = gym.spaces.Dict({a: s[0] for a, s in AGENTS.items()})
AGENT_ACT = gym.spaces.Dict({a: s[1] for a, s in AGENTS.items()})


def _episode(seed: int) -> MultiAgentEpisode:
    """a and b observe at reset; then a acts every step, b every other step; b leaves at env step 3."""
    rng = np.random.default_rng(seed)
    episode = MultiAgentEpisode(agent_to_module_mapping_fn=lambda agent_id, _: f"p_{agent_id}")
    episode.add_env_reset(observations={"a": rng.random(3, np.float32), "b": rng.random(3, np.float32)})
    return episode


def _pipelines() -> tuple:
    obs = gym.spaces.Dict({a: s[0] for a, s in AGENTS.items()})
    act = gym.spaces.Dict({a: s[1] for a, s in AGENTS.items()})
    env_to_module = build_env_to_module_pipeline(obs, act, module_spaces=MODULES)
    module_to_env = build_module_to_env_pipeline(obs, act, multi_agent=True)
    return env_to_module, module_to_env


def test_env_to_module_makes_one_batch_per_module_with_only_agents_to_act() -> None:
    torch.manual_seed(0)
    module = MultiRLModule({m: build_module(*spaces) for m, spaces in MODULES.items()})
    env_to_module, module_to_env = _pipelines()
    assert env_to_module.observation_space == gym.spaces.Dict({m: s[0] for m, s in MODULES.items()})
    episodes = [_episode(0), _episode(1)]
    episodes[1].add_env_step(
        {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)},
        {"a": 0, "b": np.zeros(1, np.float32)},
        {"a": 1.0, "b": 0.0},
        terminateds={"b": True},
    )
    shared: dict = {}
    batch = env_to_module(rl_module=module, batch={}, episodes=episodes, explore=True, shared_data=shared)
    assert set(batch) == {"p_a", "p_b"}
    assert batch["p_a"][Columns.OBS].shape == (2, 3)  # a in both episodes
    assert batch["p_b"][Columns.OBS].shape == (1, 3)  # b only in the first: it is done in the second
    assert shared["memorized_map_structure"] == {
        "p_a": [(episodes[0].id_, "a"), (episodes[1].id_, "a")],
        "p_b": [(episodes[0].id_, "b")],
    }
    with torch.inference_mode():
        outputs = module.forward_exploration(batch)
    to_env = module_to_env(rl_module=module, batch=outputs, episodes=episodes, explore=True, shared_data=shared)
    actions = to_env[Columns.ACTIONS_FOR_ENV]
    assert [sorted(per_episode) for per_episode in actions] == [["a", "b"], ["a"]]
    assert ACT.contains(int(actions[0]["a"])) and BOX_ACT.contains(actions[0]["b"])
    assert set(to_env[Columns.ACTION_LOGP][1]) == {"a"}


def test_learner_pipeline_computes_gae_per_module() -> None:
    torch.manual_seed(0)
    module = MultiRLModule({m: build_module(*spaces) for m, spaces in MODULES.items()})
    episode = _episode(2)
    for t in range(4):
        actions = {"a": t % 2} | ({"b": np.zeros(1, np.float32)} if t % 2 == 0 and t < 3 else {})
        obs = {"a": np.full(3, t, np.float32)} | ({"b": np.full(3, -t, np.float32)} if t % 2 == 1 else {})
        rewards = {"a": 1.0, "b": 0.5}
        outputs = {agent: {Columns.ACTION_LOGP: np.float32(-0.5)} for agent in actions}
        episode.add_env_step(obs, actions, rewards, extra_model_outputs=outputs, terminateds={"__all__": t == 3})
    agents = list(episode.agent_episodes.values())
    assert [len(e) for e in agents] == [4, 2]
    obs = gym.spaces.Dict({a: s[0] for a, s in AGENTS.items()})
    act = gym.spaces.Dict({a: s[1] for a, s in AGENTS.items()})
    learner = build_learner_pipeline(obs, act, gae=(0.99, 0.95), module_spaces=MODULES)
    batch = learner(rl_module=module, batch={}, episodes=agents, explore=False, shared_data={})
    assert set(batch) == {"p_a", "p_b"}
    for module_id, steps in (("p_a", 4), ("p_b", 2)):
        rows = batch[module_id]
        assert rows[Columns.OBS].shape == (steps + 1, 3)  # + the bootstrap step
        assert rows[Columns.LOSS_MASK].tolist() == [True] * steps + [False]
        assert rows[Columns.REWARDS][:steps].tolist() == ([1.0] * 4 if module_id == "p_a" else [1.0, 1.0])
        valid = rows[Columns.ADVANTAGES][rows[Columns.LOSS_MASK]]
        assert torch.isfinite(rows[Columns.VALUE_TARGETS]).all() and valid.numel() == steps


def test_a_multi_agent_mean_std_filter_keeps_statistics_per_agent_and_skips_agents_that_did_not_observe():
    """RLlib's MeanStdFilter(multi_agent=True): each agent its own statistics, each agent's latest observation
    normalised in its episode; an agent that did not observe at the latest env step is left alone (before, any
    such step raised KeyError: tic-tac-toe's waiting player, an agent that had left). A terminated agent's last
    observation repeated by the episode was normalised already: it is not normalised (or counted) again."""
    from rlgate.connectors.env_to_module import MeanStdFilter

    space = gym.spaces.Dict({a: s[0] for a, s in AGENTS.items()})
    piece = MeanStdFilter(space, gym.spaces.Dict({a: s[1] for a, s in AGENTS.items()}), multi_agent=True)
    assert piece.observation_space["a"] == gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
    episodes = [MultiAgentEpisode(), MultiAgentEpisode()]
    a0, a1, b0 = (np.full(3, v, np.float32) for v in (0.2, 0.6, -0.5))
    episodes[0].add_env_reset(observations={"a": a0, "b": b0})
    episodes[1].add_env_reset(observations={"a": a1})  # b does not observe here
    piece(rl_module=None, batch={}, episodes=episodes)
    scaled = 1 / np.sqrt(2)  # 0.2 and 0.6: mean 0.4, sample std 0.2 * sqrt(2)
    np.testing.assert_allclose(episodes[0].agent_episodes["a"].get_observations(-1), np.full(3, -scaled), atol=1e-5)
    np.testing.assert_allclose(episodes[1].agent_episodes["a"].get_observations(-1), np.full(3, scaled), atol=1e-5)
    np.testing.assert_array_equal(episodes[0].agent_episodes["b"].get_observations(-1), np.zeros(3))  # mean of one
    state = piece.get_state()
    assert set(state) == {"a", "b"} and state["a"]["delta"][0]["count"] == 2 and state["b"]["delta"][0]["count"] == 1
    piece.check_state(state)
    # Agent a acts in episode 0 and is terminated without a last observation: the episode repeats its last one.
    episodes[0].add_env_step({}, {"a": 0, "b": 1}, {"a": 1.0, "b": 0.0}, terminateds={"a": True, "__all__": False},
                             truncateds={"__all__": False})  # fmt: skip
    piece(rl_module=None, batch={}, episodes=episodes[:1])
    assert piece.get_state()["a"]["delta"][0]["count"] == 2  # not counted again
    np.testing.assert_allclose(episodes[0].agent_episodes["a"].get_observations(-1), np.full(3, -scaled), atol=1e-5)
    merged = piece.merge_states([piece.get_state()])
    assert merged["a"]["global"][0]["count"] == 2 and merged["a"]["delta"][0]["count"] == 0


def test_a_multi_agent_run_refuses_a_piece_left_single_agent():
    """A piece with RLlib's multi_agent option left at False would meet MultiAgentEpisodes at the first step
    (an INTERNAL error for every client): the spec is refused where the pipeline is built, in one line, naming
    the piece as the spec does (before, FrameStackingLearner's Dict space failed the learner with a traceback)."""
    from rlgate.spec.imports import ImportPolicy, SpecError
    from rlgate.spec.multi_agent import build_multi_agent_env_to_module, build_multi_agent_learner_connector
    from rlgate.spec.run import RunSpec

    def spec(piece: object, pipeline: str = "env_to_module") -> RunSpec:
        return RunSpec.model_validate(
            {"multi_agent": {"policy_mapping_fn": "shared"}, "connectors": {pipeline: [piece]}}
        )

    agents = {"a": (OBS, ACT), "b": (OBS, ACT)}
    for name in ("MeanStdFilter", "PrevActionsPrevRewards", "FrameStackingEnvToModule"):
        with pytest.raises(
            SpecError, match=rf"env_to_module\[0\]: {name} runs on multi-agent episodes here: set multi_"
        ):
            build_multi_agent_env_to_module(spec(name), agents, ImportPolicy([]))
    with pytest.raises(SpecError, match=r"learner\[0\]: FrameStackingLearner runs on multi-agent episodes here"):
        build_multi_agent_learner_connector(spec("FrameStackingLearner", "learner"), MODULES, ImportPolicy([]))
    from rlgate.spec.build import build_env_to_module, build_learner_connector

    single = RunSpec.model_validate({"connectors": {"env_to_module": [{"type": "MeanStdFilter", "multi_agent": True}]}})
    with pytest.raises(SpecError, match=r"MeanStdFilter has multi_agent = true, but this spec is single-agent"):
        build_env_to_module(single, OBS, ACT, ImportPolicy([]))  # the other way round: one line, not AttributeError
    single = RunSpec.model_validate(
        {"connectors": {"learner": [{"type": "FrameStackingLearner", "multi_agent": True}]}}
    )
    with pytest.raises(SpecError, match=r"FrameStackingLearner has multi_agent = true, but this spec is single-agent"):
        build_learner_connector(single, OBS, ACT, ImportPolicy([]))
    for allowed in ("MeanStdFilter", "PrevActionsPrevRewards", "FrameStackingEnvToModule"):
        pipeline = build_multi_agent_env_to_module(
            spec({"type": allowed, "multi_agent": True}), agents, ImportPolicy([])
        )
        assert any(allowed.startswith(type(p).__name__) and p.multi_agent for p in pipeline.connectors)


def test_a_multi_agent_prev_actions_prev_rewards_adds_each_agents_own_actions_and_rewards():
    """RLlib's PrevActionsPrevRewards(multi_agent=True): the agents that observed at the latest env step take their
    own previous actions (one-hot for a's Discrete, as is for b's Box) and rewards, zero-filled before their first
    step; an agent that joins late starts from zeros; an agent that did not observe is left alone; a terminated
    agent's last observation repeated by the episode was augmented already and is not augmented again."""
    from rlgate.connectors.env_to_module import PrevActionsPrevRewards

    piece = PrevActionsPrevRewards(AGENT_OBS, AGENT_ACT, n_prev_actions=2, multi_agent=True)
    key_orig, key_actions, key_rewards = piece.ORIG_OBS_KEY, piece.PREV_ACTIONS_KEY, piece.PREV_REWARDS_KEY
    assert piece.observation_space == gym.spaces.Dict(
        {
            agent: gym.spaces.Dict(
                {
                    key_orig: OBS,
                    key_actions: gym.spaces.Box(low, 1.0 if low == 0.0 else np.inf, (2 * size,), np.float32),
                    key_rewards: gym.spaces.Box(-np.inf, np.inf, (1,), np.float32),
                }
            )
            for agent, size, low in (("a", 2, 0.0), ("b", 1, -np.inf))
        }
    )
    episode = MultiAgentEpisode(observation_space=AGENT_OBS, action_space=AGENT_ACT)
    a0, a1, b0, b1 = (np.full(3, v, np.float32) for v in (0.1, 0.2, -0.1, -0.2))

    def latest(agent: str) -> dict:
        return episode.agent_episodes[agent].get_observations(-1)

    def step(*args, **kwargs) -> None:
        episode.add_env_step(*args, **kwargs)
        assert piece(rl_module=None, batch={}, episodes=[episode]) == {}

    assert piece(rl_module=None, batch={}, episodes=[episode]) == {}  # no agent observed yet: nothing to do
    episode.add_env_reset(observations={"a": a0})
    piece(rl_module=None, batch={}, episodes=[episode])
    assert latest("a")[key_orig] is a0 and latest("a")[key_actions].tolist() == [0, 0, 0, 0]
    assert latest("a")[key_rewards].tolist() == [0]
    step({"b": b0}, {"a": 1}, {"a": 0.5})  # a's action hangs; b joins late
    assert latest("b")[key_actions].tolist() == [0, 0] and latest("b")[key_rewards].tolist() == [0]
    assert latest("a")[key_orig] is a0  # a did not observe: left alone
    step({"a": a1}, {"b": np.array([0.3], np.float32)}, {"a": 1.0, "b": 2.0})
    assert latest("a")[key_orig] is a1 and latest("a")[key_actions].tolist() == [0, 0, 0, 1]
    assert latest("a")[key_rewards].tolist() == [1.5]  # the rewards since its last action, summed
    assert episode.agent_episodes["a"].get_observations(0)[key_orig] is a0  # earlier ones stay as they were
    repeated = latest("a")
    step({"b": b1}, {"a": 0}, {"a": 0.0, "b": 1.0}, terminateds={"a": True})  # a leaves without a last observation
    assert latest("a") is repeated and latest("a")[key_orig] is a1  # not augmented twice
    assert latest("b")[key_orig] is b1
    np.testing.assert_allclose(latest("b")[key_actions], [0, 0.3])
    assert latest("b")[key_rewards].tolist() == [3.0]
    for agent in "ab":
        assert episode.agent_episodes[agent].observation_space == piece.observation_space[agent]
        assert piece.observation_space[agent].contains(latest(agent))


def test_a_multi_agent_prev_actions_prev_rewards_leaves_agents_not_in_agent_ids_alone():
    from rlgate.connectors.env_to_module import PrevActionsPrevRewards

    piece = PrevActionsPrevRewards(AGENT_OBS, AGENT_ACT, multi_agent=True, agent_ids=["b"])
    assert piece.observation_space["a"] == OBS and isinstance(piece.observation_space["b"], gym.spaces.Dict)
    episode = MultiAgentEpisode(observation_space=AGENT_OBS, action_space=AGENT_ACT)
    a0, b0 = np.zeros(3, np.float32), np.ones(3, np.float32)
    episode.add_env_reset(observations={"a": a0, "b": b0})
    piece(rl_module=None, batch={}, episodes=[episode])
    assert episode.agent_episodes["a"].get_observations(-1) is a0
    assert episode.agent_episodes["b"].get_observations(-1)[piece.ORIG_OBS_KEY] is b0


def test_a_multi_agent_mean_std_filter_leaves_what_a_later_piece_made_of_its_output_alone():
    """Dict observations: the FlattenObservations appended for the default model flattens the filter's output; when
    the pipeline runs again over that step (a server's flush, then the cut successor's step), the flat array is
    neither the filter's input form nor its own output: it is left alone (before: IndexError in map_structure)."""
    from rlgate.spec.imports import ImportPolicy
    from rlgate.spec.multi_agent import build_multi_agent_env_to_module
    from rlgate.spec.run import RunSpec

    observation = gym.spaces.Dict({"pos": OBS, "mode": gym.spaces.Discrete(3)})
    agents = {"a": (observation, ACT)}
    piece = {"type": "MeanStdFilter", "multi_agent": True}
    spec = RunSpec.model_validate(
        {"multi_agent": {"policy_mapping_fn": "shared"}, "connectors": {"env_to_module": [piece]}}
    )
    pipeline = build_multi_agent_env_to_module(spec, agents, ImportPolicy([]))
    episode = MultiAgentEpisode(
        observation_space=gym.spaces.Dict({"a": observation}), action_space=gym.spaces.Dict({"a": ACT})
    )
    episode.add_env_reset(observations={"a": {"pos": np.full(3, 0.5, np.float32), "mode": 1}})
    first = pipeline(rl_module=None, batch={}, episodes=[episode], explore=False, shared_data={})
    successor = episode.cut(len_lookback_buffer=1)
    again = pipeline(rl_module=None, batch={}, episodes=[successor], explore=False, shared_data={})
    module = "default_policy"
    assert first[module][Columns.OBS].tolist() == again[module][Columns.OBS].tolist() == [[0, 1, 0, 0, 0, 0]]
    assert pipeline.connectors[0].get_state()["a"]["delta"][0]["count"] == 1


def test_a_multi_agent_prev_actions_prev_rewards_augments_once_when_the_pipeline_runs_twice_over_a_step():
    """A server's flush runs the env-to-module pipeline over the step waiting for actions, then the cut successor's
    step runs it again; FlattenObservations (appended for the default model) has flattened the augmented
    observation by then: it is not augmented again (before, the batch's rows had different sizes)."""
    from rlgate.spec.imports import ImportPolicy
    from rlgate.spec.multi_agent import build_multi_agent_env_to_module
    from rlgate.spec.run import RunSpec

    spec = RunSpec.model_validate(
        {
            "multi_agent": {"policy_mapping_fn": "per_agent"},
            "connectors": {"env_to_module": [{"type": "PrevActionsPrevRewards", "multi_agent": True}]},
        }
    )
    pipeline = build_multi_agent_env_to_module(spec, AGENTS, ImportPolicy([]))
    assert pipeline.observation_space == gym.spaces.Dict(
        {"a": gym.spaces.Box(-np.inf, np.inf, (6,), np.float32), "b": gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)}
    )
    episode = MultiAgentEpisode(
        observation_space=AGENT_OBS, action_space=AGENT_ACT, agent_to_module_mapping_fn=lambda agent_id, _: agent_id
    )
    episode.add_env_reset(observations={"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)})
    episode.add_env_step(
        {"a": np.full(3, 2, np.float32)}, {"a": 1, "b": np.array([0.5], np.float32)}, {"a": 1.0, "b": 0.0}
    )
    first = pipeline(rl_module=None, batch={}, episodes=[episode], explore=False, shared_data={})
    successor = episode.cut(len_lookback_buffer=1)
    again = pipeline(rl_module=None, batch={}, episodes=[successor], explore=False, shared_data={})
    expected = [2, 2, 2, 0, 1, 1]  # a's observation, its action 1 one-hot, its reward
    assert first["a"][Columns.OBS].tolist() == again["a"][Columns.OBS].tolist() == [expected]
    assert successor.agent_episodes["a"].get_observations(-1).tolist() == expected


FRAME = gym.spaces.Box(-100.0, 100.0, (2,), np.float32)
FRAME_AGENTS = {"a": (FRAME, ACT), "b": (FRAME, ACT)}


def _stacking_spec(*pieces: dict, mapping: str = "shared", learner: bool = False) -> RunSpec:
    stacking = {"multi_agent": True, "num_frames": 3}
    connectors = {"env_to_module": [*pieces, {"type": "FrameStackingEnvToModule", **stacking}]}
    if learner:
        connectors["learner"] = [{"type": "FrameStackingLearner", **stacking}]
    return RunSpec.model_validate({"multi_agent": {"policy_mapping_fn": mapping}, "connectors": connectors})


def _frames_episode(mapping=lambda agent_id, _: "default_policy") -> MultiAgentEpisode:
    return MultiAgentEpisode(
        observation_space=gym.spaces.Dict({a: s[0] for a, s in FRAME_AGENTS.items()}),
        action_space=gym.spaces.Dict({a: s[1] for a, s in FRAME_AGENTS.items()}),
        agent_to_module_mapping_fn=mapping,
    )


def test_a_multi_agent_run_stacks_each_agents_own_frames_when_agents_take_turns():
    """The spec's env-to-module pipeline with FrameStackingEnvToModule(multi_agent=True, num_frames=3), agents taking
    turns (one observes per env step): the module is built for stacked frames, each agent's row stacks its own
    frames (zeros before its first, b joining at env step 1), the episodes keep single frames, and a second run
    over the same step (a server's flush, then the successor chunk's step) stacks the same frames, not stacks."""
    from rlgate.spec.imports import ImportPolicy
    from rlgate.spec.multi_agent import build_multi_agent_env_to_module

    pipeline = build_multi_agent_env_to_module(_stacking_spec(), FRAME_AGENTS, ImportPolicy([]))
    stacked = gym.spaces.Box(-100.0, 100.0, (6,), np.float32)
    assert pipeline.observation_space == gym.spaces.Dict({"default_policy": stacked})
    episode = _frames_episode()

    def rows(episode: MultiAgentEpisode) -> list:
        batch = pipeline(rl_module=None, batch={}, episodes=[episode], explore=False, shared_data={})
        return batch["default_policy"][Columns.OBS].tolist()

    def frame(v: float) -> np.ndarray:
        return np.full(2, v, np.float32)

    episode.add_env_reset(observations={"a": frame(1)})
    assert rows(episode) == [[0, 0, 0, 0, 1, 1]]
    episode.add_env_step({"b": frame(21)}, {"a": 0}, {"a": 0.0})
    assert rows(episode) == [[0, 0, 0, 0, 21, 21]]
    episode.add_env_step({"a": frame(2)}, {"b": 1}, {"b": 0.0})
    assert rows(episode) == rows(episode) == [[0, 0, 1, 1, 2, 2]]
    episode = episode.cut(len_lookback_buffer=4)  # a chunk cut while a's step waits: a keeps its frames as lookback
    assert rows(episode) == [[0, 0, 1, 1, 2, 2]]
    episode.add_env_step({"b": frame(23)}, {"a": 1}, {"a": 1.0})
    assert rows(episode) == [[0, 0, 21, 21, 23, 23]]
    assert [o.tolist() for o in episode.agent_episodes["b"].get_observations(slice(-2, None))] == [[21, 21], [23, 23]]


def test_a_multi_agent_frame_stacking_stacks_what_a_filter_before_it_wrote_and_a_terminated_agents_frame_once():
    """MeanStdFilter(multi_agent=True) before FrameStackingEnvToModule(multi_agent=True): the stacks are of the
    filtered frames in the episodes; a terminated agent's last frame, repeated by its episode, is filtered once
    and stacked as RLlib stacks it (twice: the latest frame and the one before)."""
    from rlgate.connectors import ConnectorPipelineV2
    from rlgate.connectors.env_to_module import FrameStackingEnvToModule, MeanStdFilter

    episode = _frames_episode()
    pieces = ConnectorPipelineV2(
        episode.observation_space,
        episode.action_space,
        connectors=[MeanStdFilter(multi_agent=True), FrameStackingEnvToModule(multi_agent=True, num_frames=3)],
    )
    rng = np.random.default_rng(0)
    raw = [{"a": rng.random(2, np.float32), "b": rng.random(2, np.float32)} for _ in range(3)]
    episode.add_env_reset(observations=raw[0])
    pieces(rl_module=None, batch={}, episodes=[episode])
    episode.add_env_step(raw[1], {"a": 0, "b": 1}, {"a": 1.0, "b": 1.0})
    pieces(rl_module=None, batch={}, episodes=[episode])
    episode.add_env_step({"b": raw[2]["b"]}, {"a": 0, "b": 1}, {"a": 1.0, "b": 1.0}, terminateds={"a": True})
    stacks = pieces(rl_module=None, batch={}, episodes=[episode])[Columns.OBS]
    frames = {agent: e.get_observations(slice(-3, None), fill=0.0) for agent, e in episode.agent_episodes.items()}
    assert not np.allclose(frames["a"][-1], raw[1]["a"])  # filtered in the episode
    np.testing.assert_array_equal(frames["a"][-1], frames["a"][-2])  # repeated, not filtered twice
    for agent in ("a", "b"):
        (stack,) = stacks[(episode.id_, agent, "default_policy")]
        np.testing.assert_array_equal(stack, np.concatenate(frames[agent]))


def test_a_multi_agent_learner_stacks_each_modules_chunks_with_their_lookback():
    """The spec's learner pipeline with FrameStackingLearner(multi_agent=True), one module per agent: each module's
    OBS stacks its agent's frames of a cut chunk, the frames before the chunk from its lookback, PPO's bootstrap
    step included; the modules (built for stacked frames) take them (GAE's values). The learner's intake decodes
    the chunks in the frames' spaces (`episode_module_spaces`), since the episodes keep single frames."""
    from rlgate.spec.imports import ImportPolicy
    from rlgate.spec.multi_agent import (
        build_multi_agent_env_to_module,
        build_multi_agent_learner_connector,
        build_multi_rl_module,
        episode_module_spaces,
    )

    spec, imports = _stacking_spec(mapping="per_agent", learner=True), ImportPolicy([])
    env_to_module = build_multi_agent_env_to_module(spec, FRAME_AGENTS, imports)
    modules = {m: (env_to_module.observation_space[m], env_to_module.action_space[m]) for m in ("a", "b")}
    assert modules["a"][0].shape == (6,)
    assert episode_module_spaces(spec, FRAME_AGENTS, env_to_module, imports) == FRAME_AGENTS
    torch.manual_seed(0)
    module = build_multi_rl_module(spec, modules, imports)
    episode = _frames_episode(lambda agent_id, _: agent_id)
    episode.add_env_reset(observations={"a": np.full(2, 1, np.float32), "b": np.full(2, 11, np.float32)})
    for t in range(2, 8):
        if t == 6:
            episode = episode.cut(len_lookback_buffer=2)
        outputs = {agent: {Columns.ACTION_LOGP: np.float32(-0.5)} for agent in ("a", "b")}
        episode.add_env_step(
            {"a": np.full(2, t, np.float32), "b": np.full(2, 10 + t, np.float32)},
            {"a": 0, "b": 1},
            {"a": 1.0, "b": 1.0},
            extra_model_outputs=outputs,
            terminateds={"__all__": t == 7},
        )
    learner = build_multi_agent_learner_connector(spec, modules, imports)
    agents = list(episode.to_numpy().agent_episodes.values())
    batch = learner(rl_module=module, batch={}, episodes=agents, explore=False, shared_data={})
    for module_id, base in (("a", 0), ("b", 10)):
        expected = [np.repeat(np.arange(t - 2, t + 1) + base, 2) for t in (5, 6, 7)]  # the chunk's 2 steps + 1
        np.testing.assert_array_equal(batch[module_id][Columns.OBS].numpy(), expected)
        assert torch.isfinite(batch[module_id][Columns.VALUE_TARGETS]).all()


def test_a_multi_agent_spec_refuses_frame_stacking_it_cannot_serve_in_one_line():
    """FrameStackingEnvToModule(multi_agent=True) stacks into the batch only: a piece after it that changes
    observations (in the episodes) would bypass the stacks, and the default model's FlattenObservations would
    too (2-D frames): both refused, naming the fix; so is an agent whose observations are no Box (a game's Dict)."""
    from rlgate.spec.imports import ImportPolicy, SpecError
    from rlgate.spec.multi_agent import build_multi_agent_env_to_module

    spec = RunSpec.model_validate(
        {
            "multi_agent": {"policy_mapping_fn": "shared"},
            "connectors": {
                "env_to_module": [
                    {"type": "FrameStackingEnvToModule", "multi_agent": True, "num_frames": 3},
                    {"type": "MeanStdFilter", "multi_agent": True},
                ]
            },
        }
    )
    with pytest.raises(SpecError, match=r"env_to_module\[1\]: MeanStdFilter changes the observations that Frame"):
        build_multi_agent_env_to_module(spec, FRAME_AGENTS, ImportPolicy([]))
    image_rows = gym.spaces.Box(0.0, 1.0, (4, 5), np.float32)
    with pytest.raises(SpecError, match=r"put \{ type = \"FlattenObservations\", multi_agent = true \} before Frame"):
        build_multi_agent_env_to_module(_stacking_spec(), {"a": (image_rows, ACT)}, ImportPolicy([]))
    flat_first = _stacking_spec({"type": "FlattenObservations", "multi_agent": True})
    pipeline = build_multi_agent_env_to_module(flat_first, {"a": (image_rows, ACT)}, ImportPolicy([]))
    assert pipeline.observation_space["default_policy"].shape == (60,)
    game = gym.spaces.Dict({"observation": gym.spaces.Box(0, 1, (3, 3, 2), np.int8), "action_mask": FRAME})
    with pytest.raises(SpecError, match=r"^connectors.env_to_module: FrameStacking needs a Box observation space for"):
        build_multi_agent_env_to_module(_stacking_spec(), {"a": (game, ACT)}, ImportPolicy([]))


def test_a_mean_std_filter_after_frame_stacking_is_refused_even_where_it_keeps_the_space():
    """Unclipped over an unbounded Box, MeanStdFilter(multi_agent=True) has its input's space, yet it normalises
    in the episodes, after the stacks of raw frames went into the batch: the module would act on raw stacks
    and learn from normalised ones. Refused as a clipped one is."""
    from rlgate.spec.imports import ImportPolicy, SpecError
    from rlgate.spec.multi_agent import build_multi_agent_env_to_module

    unbounded = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    spec = RunSpec.model_validate(
        {
            "multi_agent": {"policy_mapping_fn": "shared"},
            "connectors": {
                "env_to_module": [
                    {"type": "FrameStackingEnvToModule", "multi_agent": True, "num_frames": 3},
                    {"type": "MeanStdFilter", "multi_agent": True, "clip_by_value": None},
                ]
            },
        }
    )
    with pytest.raises(SpecError, match=r"env_to_module\[1\]: MeanStdFilter changes the observations that Frame"):
        build_multi_agent_env_to_module(spec, {"a": (unbounded, ACT), "b": (unbounded, ACT)}, ImportPolicy([]))
