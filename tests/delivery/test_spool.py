"""The spool on its own: files, sequence numbers, sizes, the byte limit and acks, without gRPC."""

from __future__ import annotations

from pathlib import Path

from rlgate.delivery.spool import Spool
from rlgate.server.metrics import ServerMetrics


def written(spool: Spool, data: bytes, steps: int = 3) -> int:
    seq = spool.next_seq()
    spool.add(seq, spool.write_tmp(seq, data), len(data), steps)
    return seq


def test_a_batch_is_visible_only_once_added_and_gone_once_acked(tmp_path: Path) -> None:
    metrics = ServerMetrics()
    spool = Spool(tmp_path, max_bytes=1 << 20, metrics=metrics)
    seq = spool.next_seq()
    tmp = spool.write_tmp(seq, b"x" * 10)
    assert spool.files() == [] and spool.bytes == 0  # written, not yet in the spool
    spool.add(seq, tmp, 10, 4)
    assert [p.name for p in spool.files()] == ["000000000000.pb"] and spool.bytes == 10 and spool.steps == 4
    assert metrics.registry.get_sample_value("rlgate_spool_batches") == 1
    assert metrics.registry.get_sample_value("rlgate_spool_bytes") == 10
    spool.ack(seq, spool.files()[0])
    assert spool.files() == [] and spool.bytes == 0 and spool.steps == 0 and spool.acked == 1
    assert metrics.registry.get_sample_value("rlgate_spool_batches") == 0
    assert metrics.registry.get_sample_value("rlgate_acked_batches_total") == 1


def test_full_at_the_limit_and_ack_says_when_it_makes_room(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=25, metrics=ServerMetrics())
    first, second, third = (written(spool, b"y" * 10) for _ in range(3))
    assert spool.full() and spool.bytes == 30
    paths = {int(p.stem): p for p in spool.files()}
    assert spool.ack(second, paths[second]) is True  # 30 -> 20: room again
    assert spool.ack(first, paths[first]) is False  # it was not full
    assert not spool.full() and [int(p.stem) for p in spool.files()] == [third]


def test_a_restart_counts_what_is_left_continues_the_numbers_and_drops_torn_writes(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=100, metrics=ServerMetrics())
    for size in (7, 9):
        written(spool, b"z" * size)
    spool.write_tmp(spool.next_seq(), b"torn")  # a crash between write and rename
    again = Spool(tmp_path, max_bytes=100, metrics=ServerMetrics())
    assert again.bytes == 16 and len(again.files()) == 2
    assert not list(tmp_path.glob("*.tmp"))
    assert again.next_seq() == 2  # after the newest batch in the spool
