"""The bench's results as plain-text tables, ratios to the floors, and the goals met or missed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlgate.bench.placement import NODE, PLACEMENTS
from rlgate.server.metrics import STAGES

Record = dict[str, Any]

# (what, scenario, clients, envs per message, figure of the record, "<=" or ">=", target)
GOALS: tuple[tuple[str, str, int, int, Callable[[Record], float], str, float], ...] = (
    ("B1 p50 round trip, ms", "B1", 1, 1, lambda r: r["p50_ms"], "<=", 0.25),
    ("B1 p99 round trip, ms", "B1", 1, 1, lambda r: r["p99_ms"], "<=", 0.6),
    ("B1 server CPU, us per env step", "B1", 1, 1, lambda r: r["server_cpu_us_per_step"], "<=", 70),
    ("B2 K=64 env steps/s", "B2", 64, 1, lambda r: r["env_steps_per_s"], ">=", 15_000),
    ("B2 K=64 p99, ms", "B2", 64, 1, lambda r: r["p99_ms"], "<=", 8),
    ("B2 K=64 x bare floor", "B2", 64, 1, lambda r: r["env_steps_per_s"] / r["floor_env_steps_per_s"], ">=", 0.7),
    ("B3 E=32 env steps/s", "B3", 16, 32, lambda r: r["env_steps_per_s"], ">=", 200_000),
    ("B3 E=32 x bare floor", "B3", 16, 32, lambda r: r["env_steps_per_s"] / r["floor_env_steps_per_s"], ">=", 0.5),
    ("B4 non-forward CPU at 1 env/msg (K=64), us/step", "B4", 64, 1, lambda r: non_forward(r), "<=", 50),
    ("B4 non-forward CPU at 32 envs/msg, us/step", "B4", 16, 32, lambda r: non_forward(r), "<=", 3),
    # Server CPU per env step against the floors', the ratio that holds whichever side set the pace.
    ("B1 server CPU/step x bare floor", "B1", 1, 1, lambda r: cpu_ratio(r, "floor"), "<=", 1.2),
    ("B1 server CPU/step x transport floor", "B1", 1, 1, lambda r: cpu_ratio(r, "transport"), "<=", 2),
    ("B2 K=64 server CPU/step x bare floor", "B2", 64, 1, lambda r: cpu_ratio(r, "floor"), "<=", 1.2),
    ("B3 E=32 server CPU/step x bare floor", "B3", 16, 32, lambda r: cpu_ratio(r, "floor"), "<=", 1.2),
    ("B3 E=128 server CPU/step x bare floor", "B3", 16, 128, lambda r: cpu_ratio(r, "floor"), "<=", 1.2),
    # Acting in the client at one env per client, where every action would otherwise cross the network (issue 37).
    ("B8 1x1 local inference x server-side, steps/s training", "B8", 1, 1, lambda r: r["local_x_server"], ">=", 5),
    ("B8 4x1 local inference x server-side, steps/s training", "B8", 4, 1, lambda r: r["local_x_server"], ">=", 3),
)


# rlgate's figures shown as ratios to the bare floor's (rlgate / floor): column name -> record key. Server
# CPU per env step first: it holds whichever side limited a point, while steps/s compares the clients'
# pace when the load is what limited (`limited_by`).
RATIOS = {
    "cpu/step": "server_cpu_us_per_step",
    "steps/s": "env_steps_per_s",
    "p50": "p50_ms",
    "p99": "p99_ms",
    "p99.9": "p999_ms",
}
LIMITS = (
    "limited by: server = its core >= 0.9 busy; load = a load process >= 0.9 of its core in some window (the "
    "steps/s are then the clients' pace, not the server's: read x cpu/step); round trip = neither saturated"
)
PLACEMENT_NOTE = (
    "B8: steps/s while a learner trains on them (trained/s: env steps it trained in the same windows, from its own "
    "counter; ranks: its data-parallel learners); p50/p99: one step "
    "of a client (server-side: its round trip; local: acting, recording and stepping its envs); server cpu us/step "
    "over every env step, its sessions' or its local clients'; local-node (--node-client): the Node.js client acting "
    "itself, one process per client, x local: its steps/s over the Python local client's (torch) in the same run"
)
HAND_OFF_LIMITS = (
    "B7 limited by: learner = the server's spool reached its limit (it paused sampling until the learner took "
    "chunks in); else as above"
)


def cpu_ratio(record: Record, floor: str) -> float:
    """rlgate's server CPU per env step over that of a floor ("floor": the bare one, or "transport")."""
    return record["server_cpu_us_per_step"] / record[f"{floor}_server_cpu_us_per_step"]


def non_forward(record: Record) -> float:
    """Server CPU per env step outside the forward pass."""
    return record["server_cpu_us_per_step"] - record["stages_us"]["forward"]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Columns right-aligned to their widest cell."""
    cells = [headers, *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def render(records: list[Record]) -> str:
    """All tables and the goals, as text."""
    by_scenario = {s: [r for r in records if r["scenario"] == s] for s in ("B1", "B2", "B3", "B4", "B7", "B8")}
    loads = [r for s in ("B1", "B2", "B3") for r in by_scenario[s]]
    throughput = table(
        ["rlgate", "clients", "envs/msg", "cpu us/step", "steps/s", "p50 ms", "p99 ms", "p99.9 ms", "batch",
         "server cpu", "client cpu", "limited by"],
        [
            [r["scenario"], r["clients"], r["envs_per_message"], r["server_cpu_us_per_step"], r["env_steps_per_s"],
             r["p50_ms"], r["p99_ms"], r["p999_ms"], r["mean_batch"], r["server_cpu"], r["client_cpu_peak"],
             r["limited_by"]]
            for r in loads
        ],
    )  # fmt: skip
    floors = table(
        ["floors", "clients", "envs/msg", "cpu us/step", "bare steps/s", "p50 ms", "p99 ms", "p99.9 ms", "server cpu",
         "client cpu", "limited by", *(f"x {figure}" for figure in RATIOS), "in-proc steps/s", "x in-proc"],
        [
            [r["scenario"], r["clients"], r["envs_per_message"], r["floor_server_cpu_us_per_step"],
             r["floor_env_steps_per_s"], r["floor_p50_ms"], r["floor_p99_ms"], r["floor_p999_ms"],
             r["floor_server_cpu"], r["floor_client_cpu_peak"], r["floor_limited_by"],
             *(r[key] / r[f"floor_{key}"] for key in RATIOS.values()), r["inprocess_env_steps_per_s"],
             r["env_steps_per_s"] / r["inprocess_env_steps_per_s"]]
            for r in loads
        ],
    )  # fmt: skip
    stages = table(
        ["B4 us/env step", "clients", "envs/msg", *STAGES, "untimed", "total", "non-forward", "queue wait us/msg"],
        [
            [r["scenario"], r["clients"], r["envs_per_message"], *(r["stages_us"][s] for s in STAGES),
             r["stages_us"]["untimed"], r["server_cpu_us_per_step"], non_forward(r), r["queue_wait_us"]]
            for r in by_scenario["B4"]
        ],
    )  # fmt: skip
    hand_off = table(
        ["", "clients", "envs/msg", "steps/s", "cpu us/step", "server cpu", "chunks shipped/s", "accepted/s",
         "MB/s", "max spool MB", "spool limit MB", "unacked", "chunks", "steps lost", "limited by"],
        [
            [r["scenario"], r["clients"], r["envs_per_message"], r["env_steps_per_s"], r["server_cpu_us_per_step"],
             r["server_cpu"], r["shipped_per_s"],
             r["episodes_per_s"], r["bytes_per_s"] / 1e6, r["max_spool_bytes"] / 1e6, r["spool_limit_bytes"] / 1e6,
             r["unacked_batches"], r["chunks"], r["steps_lost"], r["limited_by"]]
            for r in by_scenario["B7"]
        ],
    )  # fmt: skip
    parts = [throughput, floors, LIMITS, stages, hand_off, HAND_OFF_LIMITS, render_placement(records)]
    return "\n\n".join(parts)


def render_placement(records: list[Record]) -> str:
    """B8's table, its note and the goals measured."""
    placement = table(
        ["B8 acting", "clients", "envs/client", "steps/s", "x server-side", "x local", "trained/s", "ranks",
         "updates/s", "staleness", "p50 ms", "p99 ms", "cpu us/step", "server cpu", "client cpu", "limited by"],
        [
            [where, r["clients"], r["envs_per_message"], p["env_steps_per_s"],
             r.get(f"{where.replace('-', '_')}_x_server", ""), r.get(f"{where.replace('-', '_')}_x_local", ""),
             p["trained_per_s"], r["learners"], p["updates_per_s"], p["staleness"], p["p50_ms"], p["p99_ms"],
             p["server_cpu_us_per_step"], p["server_cpu"], p["client_cpu_peak"], p["limited_by"]]
            for r in records
            if r["scenario"] == "B8"
            for where, p in ((where, r[where]) for where in (*PLACEMENTS, NODE) if where in r)
        ],
    )  # fmt: skip
    return "\n\n".join([placement, PLACEMENT_NOTE, goals(records)])


def render_envs(records: list[Record]) -> str:
    """`rlgate bench --env`'s table: each env and load, and server CPU per env step against CartPole's."""
    baseline = {(r["clients"], r["envs_per_message"]): r for r in records if r["env"] == records[-1]["env"]}
    return "\n\n".join([
        table(
            ["env", "clients", "envs/msg", "steps/s", "cpu us/step", "x baseline cpu/step", "bytes/step out",
             "bytes/step in", "batch", "p50 ms", "p99 ms", "server cpu", "client cpu", "limited by"],
            [
                [r["env"], r["clients"], r["envs_per_message"], r["env_steps_per_s"], r["server_cpu_us_per_step"],
                 r["server_cpu_us_per_step"] / baseline[r["clients"], r["envs_per_message"]]["server_cpu_us_per_step"],
                 r["bytes_out_per_step"], r["bytes_in_per_step"], r["mean_batch"], r["p50_ms"], r["p99_ms"],
                 r["server_cpu"], r["client_cpu_peak"], r["limited_by"]]
                for r in records
            ],
        ),
        table(
            ["us/env step", "clients", "envs/msg", *STAGES, "untimed", "total"],
            [
                [r["env"], r["clients"], r["envs_per_message"], *(r["stages_us"][s] for s in STAGES),
                 r["stages_us"]["untimed"], r["server_cpu_us_per_step"]]
                for r in records
            ],
        ),
        f"x baseline cpu/step: server CPU per env step over {records[-1]['env']}'s at the same load, in this run",
        LIMITS,
    ])  # fmt: skip


def goals(records: list[Record]) -> str:
    """Each goal with the measured figure, whether it is met, and the transport floor's figure where it has
    one (goals of unmeasured points are left out)."""
    rows = []
    for what, scenario, clients, envs, figure, comparison, target in GOALS:
        found = [
            r for r in records if (r["scenario"], r["clients"], r["envs_per_message"]) == (scenario, clients, envs)
        ]
        if found:
            value = figure(found[0])
            met = value <= target if comparison == "<=" else value >= target
            verdict = "met" if met else "MISSED"
            rows.append([what, value, f"{comparison} {target:g}", verdict, _transport(found[0], figure)])
    return table(["goal", "measured", "target", "", "transport floor"], rows)


def _transport(record: Record, figure: Callable[[Record], float]) -> float | str:
    """The goal's figure for the transport floor under the same load ("" where it has none: ratios, stages)."""
    measured = {key.removeprefix("transport_"): v for key, v in record.items() if key.startswith("transport_")}
    try:
        return figure(measured)
    except KeyError:
        return ""


def profiles(label: str, summaries: dict[str, dict[str, list[tuple[str, float]]]]) -> str:
    """The profile summaries of one measured point, process by process."""
    lines = [f"profile {label}:"]
    for process, ranked in summaries.items():
        for kind, functions in ranked.items():
            shares = ", ".join(f"{name} {share:.0%}" for name, share in functions)
            lines.append(f"  {process} {kind}: {shares}")
    return "\n".join(lines)
