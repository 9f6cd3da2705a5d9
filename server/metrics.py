"""Prometheus metrics of one inference server, in a registry of its own (servers can share a process)."""

from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from rlgate.episodes.chunk import EPISODE_ENDS

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
        # Added to per message and per batch: hot-path metrics, plain Python numbers (see HotCounter).
        self.env_steps = HotCounter(
            "rlgate_env_steps", "Env steps received (transitions; reset observations do not count).", registry=r
        )
        self.sessions = Gauge("rlgate_sessions", "Open client sessions.", registry=r)
        self.handovers = Counter(
            "rlgate_handovers",
            "Sessions told to reconnect at their episodes' end, and local clients told to reconnect (max session age, "
            "or a stopping server).",
            registry=r,
        )
        self.batch_size = HotHistogram(
            "rlgate_batch_size", "Env steps per forward pass.", buckets=_BATCH_BUCKETS, registry=r
        )
        self.forward_seconds = HotHistogram(
            "rlgate_forward_seconds",
            "Time of one batch: env-to-module, forward and module-to-env.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.step_latency = HotHistogram(
            "rlgate_step_latency_seconds",
            "Server time from a step message arriving to its actions leaving.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.episodes = Counter("rlgate_episodes", "Episode chunks shipped, by how they ended.", ["end"], registry=r)
        # Its children by end, looked up once: labels() takes a lock and builds a key (3 us a chunk here).
        self.episode_ends = {end: self.episodes.labels(end) for end in EPISODE_ENDS}
        self.model_version = Gauge("rlgate_model_version", "Version of the model answering requests.", registry=r)
        # Added to per message and per batch on the hot path: plain floats, exported as the counter
        # rlgate_stage_seconds_total{stage}. Each stage is added to by one thread only (the event loop, or
        # the batches' thread).
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
        # Local-inference clients (server/local_clients.py: the gauges read it when scraped).
        self.local_clients = Gauge(
            "rlgate_local_clients", "Local-inference clients sending episodes (SubmitEpisodes streams).", registry=r
        )
        self.local_env_steps = Counter(
            "rlgate_local_env_steps", "Env steps taken in from local-inference clients' episode batches.", registry=r
        )
        self.local_staleness = Gauge(
            "rlgate_local_staleness",
            "Versions the newest step a local-inference client sent is behind the served model, the most of any.",
            registry=r,
        )
        ProcessCollector(registry=r)

    def report_pause(self, reason: Callable[[], str | None]) -> None:
        """Export rlgate_paused{reason=...}: 1 with `reason()` while sampling is paused, else 0."""
        self.registry.register(_Paused(reason))


class HotCounter(Collector):
    """A counter added to on the hot path: a plain float, exported as a prometheus counter when scraped.

    prometheus_client's Counter.inc() is four Python calls and a lock (and its Histogram.observe() a lock
    and a walk over the buckets): three observes and an inc per step cost ~6 us in a hot loop here, more
    on a server's cold path. Here each metric has one writer thread (the event loop, or the batches'
    thread) and the scrape only reads, so plain numbers need no lock.
    """

    def __init__(self, name: str, documentation: str, *, registry: CollectorRegistry) -> None:
        self._name, self._documentation = name, documentation
        self.value = 0.0
        registry.register(self)

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def collect(self) -> list[CounterMetricFamily]:
        return [CounterMetricFamily(self._name, self._documentation, value=self.value)]


class HotHistogram(Collector):
    """A histogram observed on the hot path (as HotCounter): a count per bucket and a sum, exported as a
    prometheus histogram whose count is the sum of the bucket counts read in one go."""

    def __init__(
        self, name: str, documentation: str, *, buckets: tuple[float, ...], registry: CollectorRegistry
    ) -> None:
        self._name, self._documentation = name, documentation
        self._bounds = list(buckets)
        self._counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf only)
        self._sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1  # a bucket counts the values <= its bound
        self._sum += value

    def collect(self) -> list[HistogramMetricFamily]:
        counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, count in zip([*self._bounds, float("inf")], counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
        return [HistogramMetricFamily(self._name, self._documentation, buckets=buckets, sum_value=total)]


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
