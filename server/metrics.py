"""Prometheus metrics of one inference server, in a registry of its own (servers can share a process)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Latency buckets from 50 us to 1 s: a forward pass on CPU is ~0.1-10 ms, a round trip ~0.2-50 ms.
_LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class ServerMetrics:
    """The server's counters, gauges and histograms (the names deploy/grafana and deploy/prometheus.yml use)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.env_steps = Counter(
            "rlgate_env_steps", "Env steps received (transitions; reset observations do not count).", registry=r
        )
        self.sessions = Gauge("rlgate_sessions", "Open client sessions.", registry=r)
        self.batch_size = Histogram(
            "rlgate_batch_size", "Env steps per forward pass.", buckets=_BATCH_BUCKETS, registry=r
        )
        self.forward_seconds = Histogram(
            "rlgate_forward_seconds",
            "Time of one batch: env-to-module, forward and module-to-env.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.step_latency = Histogram(
            "rlgate_step_latency_seconds",
            "Server time from a step message arriving to its actions leaving.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.episodes = Counter("rlgate_episodes", "Episode chunks shipped, by how they ended.", ["end"], registry=r)
        self.model_version = Gauge("rlgate_model_version", "Version of the model answering requests.", registry=r)
        self.stage_seconds = Counter(
            "rlgate_stage_seconds",
            "Server CPU time per stage (decode, append, env_to_module, forward, module_to_env, encode).",
            ["stage"],
            registry=r,
        )
        self.spool_batches = Gauge(
            "rlgate_spool_batches", "Episode batches in the spool, not yet acknowledged by the learner.", registry=r
        )
        self.spool_bytes = Gauge(
            "rlgate_spool_bytes", "Bytes in the spool; at max_spool the server pauses sampling.", registry=r
        )
        self.spooled_bytes = Counter(
            "rlgate_spooled_bytes", "Bytes of episode batches written to the spool for the learner.", registry=r
        )
        self.acked_batches = Counter("rlgate_acked_batches", "Episode batches the learner acknowledged.", registry=r)
        self.rejected = Counter("rlgate_rejected", "Calls ended with an error status.", ["code"], registry=r)
