"""bench.profile.summary over py-spy's raw output, including the torn lines that non-blocking sampling yields."""

from __future__ import annotations

from pathlib import Path

from rlgate.bench.profile import summary

# py-spy --format raw: one `frame;frame;... count` line per distinct stack, outermost frame first. The middle
# three lines are one torn sample, read while a function name changed (seen in a real bench run).
RAW = """\
main (server/main.py:236);_step (server/policy_service.py:187);observe (server/session.py:114) 6
main (server/main.py:236);run (threading.py:982);Thread.run (threading.py:982) 2
import uvicorn
 (from typing import Any
:-1779070598);__len__ (episodes/infinite_lookback_buffer.py:86) 1
main (server/main.py:236);select (selectors.py:468);EpollSelector.select (selectors.py:468) 5
"""


def test_summary_ranks_busy_samples_and_skips_torn_lines(tmp_path: Path) -> None:
    raw = tmp_path / "server.txt"
    raw.write_text(RAW)
    ranked = summary(raw)
    # 9 busy samples: the 5 waiting in epoll are left out, the torn lines without a count too.
    assert ranked["self"] == [
        ("observe (server/session.py)", 6 / 9),
        ("Thread.run (threading.py)", 2 / 9),
        ("__len__ (episodes/infinite_lookback_buffer.py)", 1 / 9),
    ]
    # The innermost frame of ours: the poller thread's sample counts for the entry point's main.
    assert dict(ranked["ours"])["main (server/main.py)"] == 2 / 9
