"""Prometheus metrics of the learner, in a registry of its own."""

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector


class LearnerMetrics:
    """Training progress and data flow, as scraped from the learner's /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.model_version = Gauge("rlgate_learner_model_version", "Latest published model version.", registry=r)
        self.episodes = Counter("rlgate_learner_episodes", "Episode chunks accepted for training.", registry=r)
        self.env_steps = Counter("rlgate_learner_env_steps", "Env steps consumed by updates.", registry=r)
        self.duplicates = Counter(
            "rlgate_learner_duplicates", "Chunks dropped as already seen (episode id, chunk index).", registry=r
        )
        self.stale = Counter("rlgate_learner_stale_steps", "Env steps dropped for exceeding max_staleness.", registry=r)
        self.failed_updates = Counter(
            "rlgate_learner_failed_updates",
            "Updates that raised (their data is not trained on; see the log).",
            registry=r,
        )
        self.pending_steps = Gauge(
            "rlgate_learner_pending_steps",
            "Env steps taken in and not yet trained on (at most about a train batch).",
            registry=r,
        )
        self.staleness = Gauge(
            "rlgate_learner_staleness", "Mean versions between acting and training, last update.", registry=r
        )
        self.mean_return = Gauge("rlgate_learner_mean_return", "Mean return of the last 20 episodes.", registry=r)
        self.module_mean_return = Gauge(
            "rlgate_learner_module_mean_return",
            "Multi-agent: a module's mean return (its agents' rewards summed per episode), last 20 episodes.",
            ["module"],
            registry=r,
        )
        self.episodes_per_s = Gauge("rlgate_learner_episodes_per_second", "Episodes finished per second.", registry=r)
        self.policy_loss = Gauge("rlgate_learner_policy_loss", "PPO clipped surrogate loss, last update.", registry=r)
        self.vf_loss = Gauge("rlgate_learner_vf_loss", "Value loss, last update.", registry=r)
        self.entropy = Gauge("rlgate_learner_entropy", "Mean policy entropy, last update.", registry=r)
        self.kl = Gauge("rlgate_learner_kl", "Mean KL(old || new) over the last update.", registry=r)
        self.qf_loss = Gauge(
            "rlgate_learner_qf_loss", "DQN, SAC: Q loss, mean over the last version's updates.", registry=r
        )
        self.td_error = Gauge("rlgate_learner_td_error", "DQN, SAC: mean absolute TD error, last version.", registry=r)
        self.alpha = Gauge("rlgate_learner_alpha", "SAC: the entropy temperature alpha, last version.", registry=r)
        self.epsilon = Gauge("rlgate_learner_epsilon", "DQN: the servers' exploration epsilon now.", registry=r)
        self.buffer_size = Gauge(
            "rlgate_learner_replay_buffer_steps", "DQN, SAC: env steps in the replay buffer.", registry=r
        )
        self.replay_ratio = Gauge(
            "rlgate_learner_replay_ratio", "DQN, SAC: transitions replayed per env step sampled, so far.", registry=r
        )
        self.rejected = Counter(
            "rlgate_learner_rejected_chunks",
            "Chunks refused at intake, by reason (malformed, non-finite rewards, observations, model outputs).",
            ["reason"],
            registry=r,
        )
        self.skipped_updates = Counter(
            "rlgate_learner_skipped_updates", "Updates undone because they left non-finite weights.", registry=r
        )
        ProcessCollector(registry=r)
