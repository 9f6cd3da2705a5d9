"""The learner's list of reporting servers stays bounded whatever ReportServer calls arrive."""

from __future__ import annotations

import pytest

from rlgate.learner.servers import MAX_SERVER_ID, MAX_SERVERS, Servers, peer_host
from rlgate.v1 import learner_pb2


def report(server_id: str, sessions: int = 0) -> learner_pb2.ServerReport:
    return learner_pb2.ServerReport(server_id=server_id, http_port=8081, sessions=sessions, model_version=-1)


def test_a_flood_of_made_up_ids_keeps_the_newest_and_every_server_that_still_reports() -> None:
    """Ids beyond MAX_SERVERS push out the longest silent; a server that keeps reporting is never pushed out."""
    servers = Servers()
    for i in range(3 * MAX_SERVERS):
        servers.report(report(f"flood-{i}"), "ipv4:10.0.0.9:5000")
        if i % 100 == 0:
            servers.report(report("real", sessions=i), "ipv4:10.0.0.5:41234")
    listed = servers.connected()
    assert len(listed) == MAX_SERVERS
    ids = {entry["id"] for entry in listed}
    assert "real" in ids
    assert f"flood-{3 * MAX_SERVERS - 1}" in ids and "flood-0" not in ids
    real = next(entry for entry in listed if entry["id"] == "real")
    assert real["sessions"] == 3000 and real["page"] == "http://10.0.0.5:8081/"


def test_an_id_over_the_limit_is_refused() -> None:
    servers = Servers()
    servers.report(report("s" * MAX_SERVER_ID), "ipv4:10.0.0.5:1")
    with pytest.raises(ValueError, match=f"server_id: {MAX_SERVER_ID + 1} characters > {MAX_SERVER_ID}"):
        servers.report(report("s" * (MAX_SERVER_ID + 1)), "ipv4:10.0.0.5:1")
    assert [entry["id"] for entry in servers.connected()] == ["s" * MAX_SERVER_ID]


@pytest.mark.parametrize(
    ("peer", "host"),
    [("ipv4:10.0.0.5:41234", "10.0.0.5"), ("ipv6:[::1]:41234", "[::1]"), ("unix:/tmp/sock", None), ("ipv4:", None)],
)
def test_peer_host(peer: str, host: str | None) -> None:
    assert peer_host(peer) == host
