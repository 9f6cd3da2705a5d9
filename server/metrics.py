"""Prometheus metrics of one inference server, in a registry of its own (servers can share a process)."""

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from rlgate.server.shipping import EPISODE_ENDS

# Latency buckets from 50 us to 1 s: a forward pass on CPU is ~0.1-10 ms, a round trip ~0.2-50 ms.
_LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# The server's timed stages, in hot-path order.
STAGES = ("decode", "append", "env_to_module", "forward", "module_to_env", "encode")


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
        # Its children by end, looked up once: labels() takes a lock and builds a key (3 us a chunk here).
        self.episode_ends = {end: self.episodes.labels(end) for end in EPISODE_ENDS}
        self.model_version = Gauge("rlgate_model_version", "Version of the model answering requests.", registry=r)
        # Added to per message and per batch on the hot path: plain floats (a prometheus Counter's inc() is
        # four Python calls and a lock), exported as the counter rlgate_stage_seconds_total{stage}. Each stage
        # is added to by one thread only (the event loop, or the batches' thread).
        self.stage_seconds: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        r.register(_StageSeconds(self.stage_seconds))
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
        self.spool_max_bytes = Gauge(
            "rlgate_spool_max_bytes", "The spool's limit (--max-spool): full at rlgate_spool_bytes >= this.", registry=r
        )
        self.learner_connected = Gauge(
            "rlgate_learner_connected", "1 while the server's channel to its learner is connected.", registry=r
        )
        self.learner_last_ack = Gauge(
            "rlgate_learner_last_ack_timestamp_seconds", "Unix time of the learner's last ack.", registry=r
        )
        self.non_finite_rejected = Counter(
            "rlgate_non_finite_rejected",
            "Step messages rejected for a NaN or infinite value, by field (obs, reward).",
            ["field"],
            registry=r,
        )
        ProcessCollector(registry=r)

    def report_pause(self, reason: Callable[[], str | None]) -> None:
        """Export rlgate_paused{reason=...}: 1 with `reason()` while sampling is paused, else 0."""
        self.registry.register(_Paused(reason))


class _StageSeconds(Collector):
    def __init__(self, seconds: dict[str, float]) -> None:
        self._seconds = seconds

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "rlgate_stage_seconds",
            "Server CPU time per stage (decode, append, env_to_module, forward, module_to_env, encode).",
            labels=["stage"],
        )
        for stage, seconds in list(self._seconds.items()):
            family.add_metric([stage], seconds)
        yield family


class _Paused(Collector):
    def __init__(self, reason: Callable[[], str | None]) -> None:
        self._reason = reason

    def collect(self) -> Iterator[GaugeMetricFamily]:
        reason = self._reason()
        family = GaugeMetricFamily(
            "rlgate_paused", "1 while sampling is paused, with why (e.g. spool full); 0 when not.", labels=["reason"]
        )
        family.add_metric([reason or ""], 1.0 if reason else 0.0)
        yield family
