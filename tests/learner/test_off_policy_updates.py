"""DQN's and SAC's updates and the off-policy trainer: TD targets as the papers define them, target networks,
learning on small bandits, the replay ratio, and updates undone for non-finite results."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.connectors import ConnectorV2
from rlgate.connectors.builders import build_learner_pipeline
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.dqn import DQNLearner
from rlgate.learner.episode_replay_buffer import N_STEP, WEIGHTS
from rlgate.learner.off_policy_trainer import OffPolicyTrainer
from rlgate.models import DQNModule, ModelConfig, SACModule
from rlgate.spec.algorithm import DQNConfig, SACConfig

OBS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
CONFIG = ModelConfig(fcnet_hiddens=(32,), fcnet_activation="relu", ortho_init=False)


@pytest.fixture(autouse=True)
def one_thread():
    """Small updates on one thread, as the learner runs them (`rlgate up` gives it one): torch's pool of threads
    costs more than it gains on these sizes, and far more on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def bandit_chunks(rng: np.random.Generator, n: int, act, reward) -> list[SingleAgentEpisode]:
    """n one-step episodes: a random one-hot observation, the action `act(obs)`, reward `reward(obs, action)`."""
    chunks = []
    for _ in range(n):
        obs = np.eye(2, dtype=np.float32)[rng.integers(2)]
        action = act(obs)
        chunks.append(
            SingleAgentEpisode(
                observations=[obs, obs],
                actions=[action],
                rewards=[reward(obs, action)],
                extra_model_outputs={Columns.MODEL_VERSION: [np.int64(0)]},
                terminated=True,
                len_lookback_buffer=0,
            ).to_numpy()
        )
    return chunks


def pipeline(action_space: gym.Space) -> object:
    return build_learner_pipeline(OBS, action_space, next_observations=True)


def test_dqn_targets_are_double_q_n_step_and_zero_after_termination() -> None:
    torch.manual_seed(0)
    config = DQNConfig(lr=1e-3, gamma=0.9, double_q=True, dueling=False, grad_clip=None)
    module = DQNModule(OBS, gym.spaces.Discrete(3), CONFIG, dueling=False)
    learner = DQNLearner(module, config)
    with torch.no_grad():  # a target network that differs from the trained one
        for parameter in learner.target.parameters():
            parameter.add_(torch.randn_like(parameter))
    batch = {
        Columns.OBS: torch.randn(6, 2),
        Columns.NEXT_OBS: torch.randn(6, 2),
        Columns.ACTIONS: torch.tensor([0, 1, 2, 0, 1, 2]),
        Columns.REWARDS: torch.tensor([1.0, 0.5, -1.0, 2.0, 0.0, 1.5]),
        Columns.TERMINATEDS: torch.tensor([False, True, False, False, True, False]),
        N_STEP: torch.tensor([1, 1, 3, 2, 1, 3]),
        WEIGHTS: torch.ones(6),
    }
    with torch.no_grad():
        q = module.compute_q_values({Columns.OBS: batch[Columns.OBS]})
        chosen = q.gather(-1, batch[Columns.ACTIONS].unsqueeze(-1)).squeeze(-1)
        best = module.compute_q_values({Columns.OBS: batch[Columns.NEXT_OBS]}).argmax(-1)  # the trained net picks
        rated = learner.target.compute_q_values({Columns.OBS: batch[Columns.NEXT_OBS]}).gather(-1, best[:, None])
        alive = 1.0 - batch[Columns.TERMINATEDS].float()
        target = batch[Columns.REWARDS] + 0.9 ** batch[N_STEP].float() * alive * rated.squeeze(-1)
    stats, td_error = learner.update(batch, config.at(0))
    assert torch.allclose(td_error, (chosen - target).abs(), atol=1e-5)
    assert stats["td_error_mean"] == pytest.approx(float((chosen - target).abs().mean()), rel=1e-5)
    before = [p.detach().clone() for p in learner.target.parameters()]
    learner.update_target(0.25)
    for old, new, trained in zip(before, learner.target.parameters(), module.parameters(), strict=True):
        assert torch.allclose(new, old + 0.25 * (trained.detach() - old), atol=1e-6)


def test_dqn_learns_a_bandit_through_the_trainer_and_sets_epsilon_from_its_schedule() -> None:
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    config = DQNConfig(
        lr=1e-2,
        train_batch_size=32,
        training_intensity=32.0,  # one update per env step
        num_steps_sampled_before_learning_starts=32,
        broadcast_interval=64,
        epsilon=[(0, 1.0), (200, 0.1)],
        target_network_update_freq=0,
        tau=0.1,
    )
    module = DQNModule(OBS, gym.spaces.Discrete(2), CONFIG, epsilon=1.0)
    trainer = OffPolicyTrainer(module, pipeline(gym.spaces.Discrete(2)), config, seed=1)
    # Action 0 pays 1 in state [1, 0], action 1 pays 1 in state [0, 1]; random behaviour.
    stats = trainer.update(bandit_chunks(rng, 16, lambda o: int(rng.integers(2)), lambda o, a: float(o[a])))
    assert stats["updates"] == 0 and trainer.version == 0 and len(trainer.buffer) == 16  # before learning starts
    for _ in range(10):
        chunks = bandit_chunks(rng, 40, lambda o: int(rng.integers(2)), lambda o, a: float(o[a]))
        stats = trainer.update(chunks)
        while trainer.owed_updates():
            stats = trainer.update([])
    assert (
        trainer.updates == (416 - 32)
        and trainer.env_steps == 416
        and stats["replay_ratio"] == pytest.approx((416 - 32) * 32 / 416)
    )
    assert stats["epsilon"] == pytest.approx(0.1) and float(module.epsilon) == pytest.approx(0.1)
    states = torch.eye(2)
    assert module.forward_inference({Columns.OBS: states})[Columns.ACTIONS].tolist() == [0, 1]
    q = module.compute_q_values({Columns.OBS: states})
    assert torch.allclose(q.diagonal(), torch.ones(2), atol=0.15)  # terminated: Q = the reward itself


def test_a_round_runs_at_most_broadcast_interval_updates_and_one_version() -> None:
    rng = np.random.default_rng(2)
    config = DQNConfig(train_batch_size=8, training_intensity=4.0, num_steps_sampled_before_learning_starts=10)
    trainer = OffPolicyTrainer(DQNModule(OBS, gym.spaces.Discrete(2), CONFIG), pipeline(gym.spaces.Discrete(2)), config)
    stats = trainer.update(bandit_chunks(rng, 60, lambda o: 0, lambda o, a: 1.0))
    # 50 steps past the start earn 25 updates (2 env steps each); broadcast_interval (8) per round.
    assert (stats["updates"], trainer.version, trainer.owed_updates()) == (8, 1, 17)
    assert stats["env_steps"] == 60 and stats["buffer_size"] == 60
    trainer.update([])
    trainer.update([])
    stats = trainer.update([])
    assert (stats["updates"], trainer.version, trainer.owed_updates(), trainer.updates) == (1, 4, 0, 25)
    assert trainer.update([])["updates"] == 0 and trainer.version == 4


def test_an_update_that_turns_non_finite_is_undone() -> None:
    rng = np.random.default_rng(3)
    config = DQNConfig(train_batch_size=16, training_intensity=16.0, num_steps_sampled_before_learning_starts=0)
    module = DQNModule(OBS, gym.spaces.Discrete(2), CONFIG)
    trainer = OffPolicyTrainer(module, pipeline(gym.spaces.Discrete(2)), config)
    weights = {k: v.clone() for k, v in module.state_dict().items()}
    stats = trainer.update(bandit_chunks(rng, 16, lambda o: 0, lambda o, a: float("nan")))
    assert "non-finite" in stats["skipped"] and trainer.version == 0 and trainer.updates == 0
    for key, value in module.state_dict().items():
        assert torch.equal(value, weights[key])


class ScaleRewards(ConnectorV2):
    """A user's learner piece: multiplies the batch's rewards (it sees the sampled one-step episodes' batch)."""

    def __call__(self, *, batch, episodes, **kwargs):
        assert episodes, "a user's piece gets the sampled episodes"
        return batch


def test_with_a_users_learner_piece_the_sampled_episodes_go_through_the_pipeline() -> None:
    rng = np.random.default_rng(4)
    config = DQNConfig(train_batch_size=8, training_intensity=8.0, num_steps_sampled_before_learning_starts=0)
    user = build_learner_pipeline(
        OBS, gym.spaces.Discrete(2), learner_connector=lambda o, a: [ScaleRewards()], next_observations=True
    )
    trainer = OffPolicyTrainer(DQNModule(OBS, gym.spaces.Discrete(2), CONFIG), user, config)
    stats = trainer.update(bandit_chunks(rng, 8, lambda o: 1, lambda o, a: 0.5))
    assert stats["updates"] == 8 and np.isfinite(stats["qf_loss"]) and stats["staleness"] == 0.0


def test_sac_learns_a_continuous_bandit_and_tunes_alpha() -> None:
    torch.manual_seed(5)
    rng = np.random.default_rng(5)
    box = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    config = SACConfig(
        train_batch_size=64,
        training_intensity=64.0,
        num_steps_sampled_before_learning_starts=64,
        broadcast_interval=50,
        actor_lr=3e-3,
        critic_lr=3e-3,
        alpha_lr=3e-3,
        replay_buffer_config={"type": "EpisodeReplayBuffer"},
    )
    module = SACModule(OBS, box, CONFIG)
    trainer = OffPolicyTrainer(module, pipeline(box), config, seed=5)
    # The best action is 0.5 in state [1, 0] and -0.5 in state [0, 1].
    best = lambda obs: 0.5 if obs[0] else -0.5  # noqa: E731

    def reward(obs, action):
        return -float((action[0] - best(obs)) ** 2)

    for _ in range(8):
        stats = trainer.update(bandit_chunks(rng, 45, lambda o: rng.uniform(-1, 1, 1).astype(np.float32), reward))
        while trainer.owed_updates():
            stats = trainer.update([])
    assert trainer.updates == 360 - 64
    dist_cls = module.get_inference_action_dist_cls()
    greedy = dist_cls.from_logits(module.forward_inference({Columns.OBS: torch.eye(2)})[Columns.ACTION_DIST_INPUTS])
    assert torch.allclose(greedy.to_deterministic().sample().squeeze(-1), torch.tensor([0.5, -0.5]), atol=0.15)
    assert stats["alpha"] < 0.5  # from 1.0, towards the target entropy
    assert all(np.isfinite(stats[key]) for key in ("qf_loss", "qf_twin_loss", "policy_loss", "alpha_loss"))


def test_discrete_sac_learns_a_bandit() -> None:
    torch.manual_seed(6)
    rng = np.random.default_rng(6)
    config = SACConfig(
        train_batch_size=64,
        training_intensity=64.0,
        num_steps_sampled_before_learning_starts=64,
        broadcast_interval=50,
        actor_lr=3e-3,
        critic_lr=3e-3,
        alpha_lr=1e-2,
        target_entropy=0.3,
    )
    module = SACModule(OBS, gym.spaces.Discrete(3), CONFIG)
    trainer = OffPolicyTrainer(module, pipeline(gym.spaces.Discrete(3)), config, seed=6)
    for _ in range(8):  # action 2 pays 1, the others 0; prioritized replay (SAC's default)
        stats = trainer.update(bandit_chunks(rng, 45, lambda o: int(rng.integers(3)), lambda o, a: float(a == 2)))
        while trainer.owed_updates():
            stats = trainer.update([])
    probs = module.forward_inference({Columns.OBS: torch.eye(2)})[Columns.ACTION_DIST_INPUTS].softmax(-1)
    # The soft-optimal policy for the temperature alpha: pi(a) ~ exp(Q(a) / alpha), Q = 1 for action 2, else 0.
    soft = np.exp(1 / stats["alpha"]) / (np.exp(1 / stats["alpha"]) + 2)
    assert np.allclose(probs[:, 2].detach().numpy(), soft, atol=0.08) and soft > 0.6
    assert stats["alpha"] < 0.6 and stats["entropy"] < 1.0  # below the start (1.0), towards the target entropy


def test_a_multi_agent_run_with_learner_pieces_of_its_own_is_refused() -> None:
    from rlgate.models import MultiRLModule
    from rlgate.spec.imports import SpecError

    modules = {"a": (OBS, gym.spaces.Discrete(2))}
    user = build_learner_pipeline(
        gym.spaces.Dict({"a": OBS}),
        gym.spaces.Dict({"a": gym.spaces.Discrete(2)}),
        learner_connector=lambda o, a: [ScaleRewards()],
        next_observations=True,
        module_spaces=modules,
    )
    module = MultiRLModule({"a": DQNModule(OBS, gym.spaces.Discrete(2), CONFIG)})
    with pytest.raises(SpecError, match=r"^connectors\.learner: multi-agent DQN takes no learner pieces"):
        OffPolicyTrainer(module, user, DQNConfig(), trainable=["a"])
