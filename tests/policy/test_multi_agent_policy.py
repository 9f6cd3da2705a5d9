"""`rlgate.MultiAgentPolicy` and `evaluate_multi_agent`: a multi-agent checkpoint's policy in plain Python acts
exactly as a server serving it would, in PettingZoo's AEC and parallel envs."""

from __future__ import annotations

import numpy as np
import pytest
from support.checkpoints import multi_agent_checkpoint

from rlgate import MultiAgentPolicy, Policy, evaluate_multi_agent
from rlgate.core.columns import Columns
from rlgate.envs.agent_envs import AgentEnvs
from rlgate.policy.acting import ActingCore
from rlgate.server.multi_agent_session import MultiAgentSession, MultiAgentSessionSpec
from rlgate.spec.env import make_agent_envs
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.multi_agent import spaces_by_agent
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint

pytest.importorskip("pettingzoo")

TICTACTOE = {  # an AECEnv; each player its own LSTM module, so each agent's state must be carried apart
    "env": {"id": "pettingzoo.classic.tictactoe_v3:env"},
    "multi_agent": {"policy_mapping_fn": "per_agent"},
    "model": {"config": {"use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 4}},
}
RPS = {  # a ParallelEnv (rock-paper-scissors), every agent on one shared module
    "env": {"id": "pettingzoo.classic.rps_v2:parallel_env", "kwargs": {"max_cycles": 6}},
    "multi_agent": {"policy_mapping_fn": "shared"},
    "connectors": {"env_to_module": [{"type": "PrevActionsPrevRewards", "multi_agent": True}]},
}

FRAMES = {  # rock-paper-scissors' one-hot observations, the last 3 of each agent stacked
    **RPS,
    "connectors": {
        "env_to_module": [
            {"type": "FlattenObservations", "multi_agent": True},
            {"type": "FrameStackingEnvToModule", "multi_agent": True, "num_frames": 3},
        ]
    },
}


@pytest.mark.parametrize("spec", [TICTACTOE, RPS, FRAMES], ids=["aec-lstm", "parallel-prev-actions", "frame-stacking"])
def test_actions_match_a_server_serving_the_same_checkpoint(tmp_path, spec):
    """Games one after another (resets included), 40 env steps: the policy's action distribution inputs equal
    a server session's, agent for agent, so each agent's LSTM state and previous actions are carried as a server
    carries them."""
    path, run = multi_agent_checkpoint(tmp_path, spec)
    policy = MultiAgentPolicy.load(path)
    assert policy.version == 4
    found = checkpoint.load(path)
    served = ActingCore.build(run, *spaces_by_agent(policy.agent_spaces), weights=found.module_weights)
    session = MultiAgentSession(
        MultiAgentSessionSpec("reference", policy.agent_spaces, 1, explore=False),
        mapping_fn=served.mapping_fn,
        rollout_fragment_length=None,
        count_steps_by="env_steps",
        lookback=1,
        write_back=served.write_back,
    )
    envs = AgentEnvs(make_agent_envs(run.env, ImportPolicy(run.modules()), 1))
    step, episode, games = envs.reset(seed=0)[0], policy.new_episode(), 0
    for _ in range(40):
        rows, _ = session.observe([step])
        reference = served.act(rows, False)
        session.record(reference)
        actions = policy.compute_actions(
            step.observations, episode, rewards=step.rewards, terminateds=step.terminateds, truncateds=step.truncateds
        )
        assert actions.keys() == reference[Columns.ACTIONS_FOR_ENV][0].keys()
        for agent, action in actions.items():
            assert action == reference[Columns.ACTIONS_FOR_ENV][0][agent]
            np.testing.assert_allclose(
                episode.last_outputs[agent][Columns.ACTION_DIST_INPUTS],
                reference[Columns.ACTION_DIST_INPUTS][0][agent],
                atol=1e-5,
            )
        if envs.done[0]:
            episode, games = policy.new_episode(), games + 1  # the next step is the env's reset
        step = envs.step([actions])[0]
    assert games >= 2


def test_evaluate_plays_whole_games_with_agent_returns_and_is_deterministic_when_greedy(tmp_path):
    path, _ = multi_agent_checkpoint(tmp_path, TICTACTOE)
    policy = MultiAgentPolicy.load(path, seed=0)
    env = make_agent_envs(policy.spec.env, ImportPolicy(policy.spec.modules()), 1)[0]
    first = evaluate_multi_agent(policy, env, 4, seed=0)
    assert first.returns == evaluate_multi_agent(policy, env, 4, seed=0).returns
    assert set(first.agent_returns) == {"player_1", "player_2"} and len(first.lengths) == 4
    for i, total in enumerate(first.returns):
        assert total == first.agent_returns["player_1"][i] + first.agent_returns["player_2"][i]
        assert 1 <= first.lengths[i] <= 9  # turns of one game (an illegal move ends it early)
    summary = first.summary()
    assert summary["agent_return_mean"]["player_1"] == pytest.approx(np.mean(first.agent_returns["player_1"]))
    sampled = [evaluate_multi_agent(policy, env, 4, explore=True).lengths for _ in range(5)]
    assert any(lengths != first.lengths for lengths in sampled)  # exploring samples other moves


def test_no_episodes_summarise_as_nothing_measured_as_a_single_agent_evaluation_does(tmp_path):
    path, _ = multi_agent_checkpoint(tmp_path, RPS)
    policy = MultiAgentPolicy.load(path, allow_import=["pettingzoo"])
    env = make_agent_envs(policy.spec.env, ImportPolicy(policy.spec.modules()), 1)[0]
    summary = evaluate_multi_agent(policy, env, 0).summary()
    assert summary["episodes"] == 0 and summary["return_mean"] is None
    assert summary["agent_return_mean"] == {"player_0": None, "player_1": None}


def test_single_and_multi_agent_policies_each_refuse_the_other_kind_in_one_line(tmp_path):
    path, _ = multi_agent_checkpoint(tmp_path, RPS)
    with pytest.raises(
        SpecError, match=r"^a multi-agent run.s weights \(one set per module\): use rlgate.MultiAgentPolicy$"
    ):
        Policy.load(path)
    single = RunSpec.parse({}, "test")
    with pytest.raises(SpecError, match=r"^a single-agent run \(no \[multi_agent\]\): use rlgate.Policy$"):
        MultiAgentPolicy(single, {})
