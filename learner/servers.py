"""The inference servers reporting to this learner (`ReportServer`), as its status and page list them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rlgate.v1 import learner_pb2

# A server that has not reported for this long no longer counts as connected (they report every second).
CONNECTED_S = 5.0
# Most servers remembered: far more than report to one learner; a flood of made-up ids pushes out the longest silent
# instead of growing the learner's memory until its status is next read.
MAX_SERVERS = 1024
# Longest server id, in characters (a server's is a uuid's hex with its host name): it is kept and shown on the page.
MAX_SERVER_ID = 256


@dataclass
class _Seen:
    report: learner_pb2.ServerReport
    host: str | None
    at: float


class Servers:
    """The latest report of every server, and where it came from."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def report(self, report: learner_pb2.ServerReport, peer: str) -> None:
        """Take a report; `peer` is gRPC's peer string ("ipv4:10.0.0.5:41234"), whose host serves its page.

        ValueError for an id over MAX_SERVER_ID characters."""
        if len(report.server_id) > MAX_SERVER_ID:
            raise ValueError(f"server_id: {len(report.server_id)} characters > {MAX_SERVER_ID}")
        self._seen.pop(report.server_id, None)  # inserted again last: the dict stays in the order of last reports
        self._seen[report.server_id] = _Seen(report, peer_host(peer), time.monotonic())
        if len(self._seen) > MAX_SERVERS:
            del self._seen[next(iter(self._seen))]  # the longest silent

    def connected(self) -> list[dict[str, Any]]:
        """The servers heard from in the last CONNECTED_S seconds, by id, as JSON-ready dicts."""
        now = time.monotonic()
        self._seen = {key: seen for key, seen in self._seen.items() if now - seen.at < CONNECTED_S}
        return [_describe(seen, now) for _, seen in sorted(self._seen.items())]


def peer_host(peer: str) -> str | None:
    """'ipv4:10.0.0.5:41234' -> '10.0.0.5', 'ipv6:[::1]:41234' -> '[::1]'; None for other transports."""
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, _port = address.rpartition(":")
    return host or None


def _describe(seen: _Seen, now: float) -> dict[str, Any]:
    r = seen.report
    page = f"http://{seen.host}:{r.http_port}/" if seen.host and r.http_port else None
    return {
        "id": r.server_id,
        "page": page,
        "sessions": r.sessions,
        "env_steps": r.env_steps,
        "local_clients": r.local_clients,
        "local_env_steps": r.local_env_steps,
        "model_version": r.model_version if r.model_version >= 0 else None,
        "spool_batches": r.spool_batches,
        "spool_bytes": r.spool_bytes,
        "max_spool_bytes": r.max_spool_bytes,
        "paused": r.paused or None,
        "seen_s_ago": round(now - seen.at, 1),
    }
