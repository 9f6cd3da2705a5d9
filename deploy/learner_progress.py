"""Whether a learner learns, read from its HTTP port: what deploy/smoke.sh waits for (the Python standard library
only: it runs on the container host, where rlgate need not be installed).

    python3 deploy/learner_progress.py baseline http://127.0.0.1:8001
    python3 deploy/learner_progress.py rose http://127.0.0.1:8001 BASELINE FACTOR

`baseline` prints the mean return of the first 20 episodes the learner counted (`/history/episodes` from its
start): played by its first versions, whenever it is read, so a late first reading cannot make the check that
follows impossible. Exit 1 while fewer have ended (wait and ask again); exit 2 when the learner did not start
from scratch (its first episode reached it after its first updates: it resumed a trained model, and a rise over
that is no evidence of learning).

`rose` exits 0 once the mean return of the learner's last 20 episodes (`/status`) is more than FACTOR times
BASELINE, 1 before, and prints where it stands.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any

WINDOW = 20  # episodes, as the learner's mean return (`rlgate.learner.intake.RETURN_WINDOW`)
FRESH_UPDATES = 4  # a learner whose first episode came within its first updates' env steps started from scratch


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def baseline(learner: str) -> int:
    """Print the mean return of the learner's first WINDOW episodes; the exit status (see the module)."""
    status = get(f"{learner}/status")
    episodes = get(f"{learner}/history/episodes?start=0&limit={WINDOW}")
    if episodes["start"] != 0:
        print(f"the learner kept no history from its start (it begins at episode {episodes['start']})")
        return 2
    rows = episodes["rows"]
    if rows and rows[0]["env_steps"] >= FRESH_UPDATES * status["train_batch_size"]:
        print(
            f"the learner did not start from scratch: its first episode came at {rows[0]['env_steps']} env steps "
            f"(train_batch_size {status['train_batch_size']}); remove its checkpoints (docker compose down -v)"
        )
        return 2
    if len(rows) < WINDOW:
        print(f"{len(rows)} of the first {WINDOW} episodes have ended")
        return 1
    print(sum(row["return"] for row in rows) / WINDOW)
    return 0


def rose(learner: str, first: float, factor: float) -> int:
    """Whether the learner's mean return is above `factor` times `first` (exit 0) or not yet (exit 1)."""
    mean = get(f"{learner}/status")["mean_return"]
    print(f"mean return {mean} (baseline {first}, needs > {factor} x)")
    return 0 if mean is not None and mean > factor * first else 1


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "baseline":
        return baseline(argv[1])
    if len(argv) == 4 and argv[0] == "rose":
        return rose(argv[1], float(argv[2]), float(argv[3]))
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
