"""B8, placement: the same loads acting on the server and acting in the clients, each while a real learner trains.

One learner (`rlgate learn`, CartPole-v1's preset: what `rlgate up` trains) and one server fed by it (`--learner`)
serve both placements, load after load, the two interleaved so that drift on a shared host hits both alike:
- server-side inference: `bench.load`'s lean clients stream every env step to the server, which acts for them;
- local inference: each client is an `EnvClient(inference="local")` that acts with the weights the server relays,
  records its episodes and sends them to the server, which relays them to the learner; once with its default
  backend (torch), once with onnxruntime (`local-onnxruntime`, as `--backend auto` picks for CartPole's model);
- with `node_client` (`rlgate bench --node-client DIR`), at loads of one env per client, local inference in Node.js
  too (`local-node`): each client a `clients/node/client.mjs --mode local` process acting on its JavaScript
  CartPole with each version's ONNX file in onnxruntime-node, its episodes to the same server.
All sample at the learner's pace (the Python clients step gymnasium's vectorised CartPole-v1), so the figures are env
steps/s while training, with what the learner trained meanwhile (`trained_per_s`, `updates_per_s`, from its own
counters) and the staleness of its last update. The learner (all its ranks, with `num_learners` above 1) runs on
every core (it trains where there is room), the server on the first, the clients on the others.
"""

from __future__ import annotations

import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

from rlgate.bench.measure import Load, Timing, under_load
from rlgate.bench.procs import ServerProcess
from rlgate.service.settings import Backend

#: The loads (clients, envs per client) B8 measures at.
LOADS = ((1, 1), (4, 1), (16, 1), (16, 8))
#: The placements, in the order each load runs them: acting on the server, in the clients with their default
#: backend (torch), and in the clients with onnxruntime (what `--backend auto` picks for CartPole's model).
PLACEMENTS = ("server", "local", "local-onnxruntime")
#: What runs each local placement's forward pass.
LOCAL_BACKENDS: dict[str, Backend] = {"local": "torch", "local-onnxruntime": "onnxruntime"}
#: The Node.js client's placement (`node_client`), measured after the others at each load of one env per client.
NODE = "local-node"


def placements(
    loads: list[Load],
    timing: Timing,
    serve: list[str],
    cores: tuple[set[int], set[int]],
    logs: Path,
    num_learners: int = 1,
    node_client: Path | None = None,
) -> dict[tuple[str, Load], dict[str, Any]]:
    """B8 at each of `loads` (real envs), the learner as `num_learners` ranks: the figures of each (placement, load),
    NODE's too where `node_client` (clients/node's folder, beside its node_modules) is given and a load has one env
    per client."""
    server_cores, client_cores = cores
    directory = logs / "placement"
    shutil.rmtree(directory, ignore_errors=True)  # a reused --logs directory: start afresh
    learn = ["learn", "--env", "CartPole-v1", "--host", "127.0.0.1", "--port", "0", "--http-port", "0", "--seed", "0"]
    learn += ["--checkpoint-dir", str(directory / "learner"), "--no-resume", "--torch-threads", "1"]
    learn += ["--num-learners", str(num_learners)]
    learner = ServerProcess("rlgate", learn, server_cores | client_cores, logs / "placement-learner.log")
    server = None
    measured = {}
    try:
        learner.wait_serving()
        serve = [*serve, "--learner", learner.target, "--spool-dir", str(directory / "spool"), "--server-id", "b8"]
        server = ServerProcess("rlgate", serve, server_cores, logs / "placement-server.log")
        server.wait_serving().wait_ready()  # ready: the learner's first weights have arrived
        for load in loads:
            for placement in PLACEMENTS:
                spool = directory / "client-spool" if placement in LOCAL_BACKENDS else None
                backend = LOCAL_BACKENDS.get(placement, "torch")
                watch = partial(_watch, learner)
                measured[placement, load] = under_load(
                    server, load, timing, client_cores, logs, watch=watch, local_spool=spool, local_backend=backend
                )
            if node_client is not None and load.envs == 1:
                watch = partial(_watch, learner)
                measured[NODE, load] = under_load(
                    server, load, timing, client_cores, logs, watch=watch, node_client=node_client
                )
    finally:
        if server is not None:
            server.stop()
        learner.stop()
    return measured


#: The longest a window waits past its length for the learner's next update to end.
UPDATE_WAIT_S = 60.0


def _watch(learner: ServerProcess, seconds: float) -> dict[str, Any]:
    """What the learner trained over a window: env steps and updates per second, and its last update's staleness.

    The window lasts `seconds`, and on until an update has ended in it (at most UPDATE_WAIT_S more): over a window
    no update ended in, the learner's counters read 0 trained however fast it trains (`--quick`'s 0.3 s windows on
    a loaded machine held fewer env steps than one update takes)."""
    before, started = learner.metrics(), time.perf_counter()
    time.sleep(seconds)
    after = learner.metrics()
    version = "rlgate_learner_model_version"
    while after[version] == before[version] and time.perf_counter() - started < seconds + UPDATE_WAIT_S:
        time.sleep(0.05)
        after = learner.metrics()
    elapsed = time.perf_counter() - started

    def rate(key: str) -> float:
        return (after[key] - before[key]) / elapsed

    return {
        "trained_per_s": rate("rlgate_learner_env_steps_total"),
        "updates_per_s": rate("rlgate_learner_model_version"),
        "staleness": after["rlgate_learner_staleness"],
    }
