"""The learner's recent history, one row per update or per finished episode, read a page at a time.

`/status` says only where training is now; the live page (and anyone else) reads histories through
`/history/<series>?start=N`, which returns the rows from index N on, so a poller fetches only what is new.
Each series keeps its newest `limit` rows; indexes keep counting, so a reader that fell behind learns
where its data starts again (`start` in the answer).
"""

from __future__ import annotations

from collections import deque
from typing import Any

PAGE_LIMIT = 1000  # most rows in one answer


class Series:
    """Rows (plain dicts, JSON-ready) numbered from 0, the newest `limit` of them kept."""

    def __init__(self, limit: int) -> None:
        self._rows: deque[dict[str, Any]] = deque(maxlen=limit)
        self.total = 0  # rows ever appended: the next row's index

    def append(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        self.total += 1

    def page(self, start: int, limit: int = PAGE_LIMIT) -> dict[str, Any]:
        """Rows from index `start` (or the oldest kept, if later), at most `limit`: `start` is the first
        row's index, `next` the index to ask for next, `total` how many rows there have been."""
        first = self.total - len(self._rows)
        start = max(start, first)
        stop = min(start + max(limit, 0), self.total)
        rows = [self._rows[i - first] for i in range(start, stop)] if start < stop else []
        return {"start": start, "next": start + len(rows), "total": self.total, "rows": rows}
