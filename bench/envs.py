"""`rlgate bench --env ENV`: an env with its preset (a pixel env: ALE/Pong-v5) served by a real server, beside
CartPole-v1 with its preset in the same run, at 1 and 4 clients of 8 envs each.

The clients step real envs made from the run spec as `rlgate env` makes them (wrappers included), so a point
is as fast as the envs step; what compares the two envs is the server's CPU per env step (`limited_by` says
which side set the pace). Each record also has the protobuf bytes per env step of the step messages and the
answers (gRPC's framing, a few bytes per message, not counted). The server serves a fresh model of the spec
(no learner): its env-to-module pieces (Pong's frame stacking) run as in training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlgate.bench.measure import Load, Timing, under_load
from rlgate.bench.procs import ServerProcess, split_cores
from rlgate.spec.presets import preset, preset_for
from rlgate.spec.run import RunSpec

BASELINE = "CartPole-v1"
LOADS = ((1, 8), (4, 8))
FIGURES: tuple[str, ...] = (
    "env_steps_per_s",
    "server_cpu_us_per_step",
    "bytes_out_per_step",
    "bytes_in_per_step",
    "mean_batch",
)
FIGURES += ("p50_ms", "p99_ms", "server_cpu", "client_cpu_peak", "limited_by", "stages_us")


def preset_spec(env_id: str) -> RunSpec:
    """The run spec of `env_id` with its preset (as `rlgate up --env ENV` would run it), seed 0."""
    name = preset_for(env_id)
    data = preset(name) if name else {}
    return RunSpec.parse({**data, "env": {**data.get("env", {}), "id": env_id}, "seed": 0}, env_id)


def run(env_id: str, timing: Timing, logs: Path) -> list[dict[str, Any]]:
    """One record per env (`env_id`, then CartPole-v1) and load point."""
    server_cores, client_cores = split_cores()
    records = []
    for env in (env_id, BASELINE):
        spec_file = logs / f"{env.replace('/', '_')}.json"
        spec_file.write_text(preset_spec(env).to_json())
        serve = ["serve", "--config", str(spec_file), "--host", "127.0.0.1", "--port", "0", "--http-port", "0"]
        server = ServerProcess("rlgate", [*serve, "--seed", "0"], server_cores, logs / f"{spec_file.stem}.log")
        try:
            server.wait_serving()
            for clients, envs in LOADS:
                load = Load(clients, envs, spec=spec_file)
                measured = under_load(server, load, timing, client_cores, logs)
                records.append(
                    {"scenario": "env", "env": env, "clients": clients, "envs_per_message": envs}
                    | {key: measured[key] for key in FIGURES}
                )
        finally:
            server.stop()
    return records
