"""The default pipelines on multi-agent episodes: batches keyed by (episode, agent, module), one per module.

The structure checked here is RLlib 2.60's: AgentToModuleMapping turns `{column: {(eps id, agent id, module id):
[items]}}` into `{module id: {column: ...}}` keeping only agents that are to act, module-to-env hands back one
`{agent id: action}` dict per episode, and the learner pipeline (GAE included) works per module.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors.builders import (
    build_env_to_module_pipeline,
    build_learner_pipeline,
    build_module_to_env_pipeline,
)
from rlgate.core.columns import Columns
from rlgate.episodes import MultiAgentEpisode
from rlgate.models import MultiRLModule, build_module

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Discrete(2)
BOX_ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
AGENTS = {"a": (OBS, ACT), "b": (OBS, BOX_ACT)}
MODULES = {"p_a": (OBS, ACT), "p_b": (OBS, BOX_ACT)}


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
