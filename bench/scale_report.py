"""From bench.scale's measured runs (and bench.actions' counts) to the model, its check and the sizing table.

Calibration (light and throughput runs only): CPU per activity step of every benchmark process
(server, worker, policy endpoint, driver) and the cores they got at saturation; the off-CPU
latency per step at one rollout at a time. Validation: the simulation predicts every run, including
realistic and held, which the calibration did not see. Sizing: `scale_model.size` for 1,000 and
10,000 rollouts at model 2 s and 20 s per turn, per rollout plan, and the simulation of the
10,000-rollout deployment with the server cores the paper model gives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.scale_model import Assumptions, Measured, Workload, heartbeats_per_turn, per_unit, simulate, size

OUT = Path(__file__).resolve().parent / "out"
ACTIONS = OUT / "actions.json"
LOADS = [(1_000, 2.0), (10_000, 2.0), (1_000, 20.0), (10_000, 20.0)]
TOOL_S = 0.1


def calibrate(runs: dict[str, Any]) -> dict[str, float]:
    """Service time per step, effective cores and off-CPU latency per step, from light and throughput."""
    sat = runs["throughput"]
    steps = sat["schedule_to_start"]["activities"]
    service_s = sum(sat["cpu_s"].values()) / steps
    cores = sat["cores_used"]
    light = runs["light"]
    per_step = light["wall_s"] / light["schedule_to_start"]["activities"]
    return {
        "service_s": round(service_s, 5),
        "cores": cores,
        "overhead_s": round(max(0.0, per_step - service_s / cores), 5),
        "activities_per_rollout": steps / sat["rollouts"],
    }


def predict(run: dict[str, Any], cal: dict[str, float]) -> dict[str, Any]:
    """The simulation of one measured run on this box: the benchmark's processes as one server as fast as the
    cores they got (the box is shared; at light load a step's CPU is mostly on its path).

    `predicted_*`: calibrated on light and throughput only (blind for the other runs). `given_cpu_*`: the same
    simulation given the run's own CPU per step and CPU share (what other agents left it varies from run to run),
    which checks the queueing and latency structure alone."""
    w = run["workload"]
    latencies = Workload(w["tool_turns"], w["model_s"], w["tool_s"]).step_latencies(run.get("plan", "classic"))
    common = {"concurrency": run["concurrency"], "rollouts": run["rollouts"], "latencies": latencies, "servers": 1}
    blind = simulate(**common, service_s=cal["service_s"], speed=cal["cores"], overhead_s=cal["overhead_s"])
    steps = run["schedule_to_start"]["activities"]
    service_s = sum(run["cpu_s"].values()) / steps
    given = simulate(**common, service_s=service_s, speed=run["cores_used"], overhead_s=cal["overhead_s"])
    return {
        "measured_wall_s": run["wall_s"],
        "predicted_wall_s": blind.wall_s,
        "error": round(blind.wall_s / run["wall_s"] - 1, 3),
        "measured_rollouts_per_s": run["rollouts_per_s"],
        "predicted_rollouts_per_s": blind.rollouts_per_s,
        "measured_rollout_p50_s": run["rollout_p50_s"],
        "predicted_rollout_p50_s": blind.duration_p50_s,
        "given_cpu_wall_s": given.wall_s,
        "given_cpu_error": round(given.wall_s / run["wall_s"] - 1, 3),
        "given_cpu_rollout_p50_s": given.duration_p50_s,
        "run_cpu_ms_per_step": round(service_s * 1000, 1),
        "run_cores": run["cores_used"],
    }


def plans(runs: dict[str, Any], actions: dict[str, Any], measured_plan: str) -> dict[str, Measured]:
    """Measured per-rollout figures of each plan bench.actions counted: the runs' plan measured here, the
    others scaled by their state transitions (server CPU), round trips (latency) and history bytes (DB)."""
    sat, held, light = runs["throughput"], runs.get("held") or runs["throughput"], runs["light"]
    classic = actions["plans"][measured_plan]
    server_per_transition = sat["server_cpu_ms_per_rollout"] / 1000 / classic["state_transitions"]
    rss = held["memory"]
    worker_mb = (rss["gymflow_rss_mb_peak"] - rss["gymflow_rss_mb_before"]) / held["concurrency"]
    per_round_trip = light["wall_s"] / light["rollouts"] / classic["workflow_tasks"]
    # The held run's slow turns heartbeat; the throughput run's do not: the difference, per heartbeat.
    held_heartbeats = heartbeating(classic) * heartbeats_per_turn(held["workload"]["model_s"], Assumptions())
    per_heartbeat = (held["server_cpu_ms_per_rollout"] - sat["server_cpu_ms_per_rollout"]) / 1000 / held_heartbeats
    per_heartbeat = max(0.0, per_heartbeat) if held_heartbeats else 0.0
    out = {}
    for label, row in actions["plans"].items():
        if "skipped" in row:
            continue
        out[label] = Measured(
            activities=row["activities"],
            round_trips=row["workflow_tasks"],
            state_transitions=row["state_transitions"],
            billable_actions=row["billable_actions"],
            heartbeating_turns=heartbeating(row),
            server_cpu_per_transition_s=server_per_transition,
            worker_cpu_per_rollout_s=sat["worker_cpu_ms_per_rollout"] / 1000,
            overhead_per_round_trip_s=per_round_trip,
            worker_mb_per_rollout=max(0.0, worker_mb),
            db_bytes_per_rollout=held["db_bytes_per_rollout"] * row["history_bytes"] / classic["history_bytes"],
            server_cpu_per_heartbeat_s=per_heartbeat,
        )
    return out


def heartbeating(counts: dict[str, Any]) -> int:
    """Model turns run as activities with a heartbeat timeout: generate (classic) and play_turn (fused)."""
    return sum(counts["activities_by_type"].get(name, 0) for name in ("generate", "play_turn"))


def deployment(measured: dict[str, Measured], runs: dict[str, Any]) -> dict[str, Any]:
    """The sizing table, and the simulation of each 10,000-rollout row on the cores the table gives."""
    rows = []
    for concurrency, model_s in LOADS:
        workload = Workload(4, model_s, TOOL_S)
        for label, m in measured.items():
            row = {"plan": label, **size(concurrency, workload, m), **per_unit(workload, m)}
            if concurrency == 10_000:
                server_per_step = m.server_cpu_per_transition_s * m.state_transitions / m.activities
                sim = simulate(
                    concurrency=concurrency, rollouts=3 * concurrency, latencies=workload.step_latencies(label),
                    service_s=server_per_step, servers=row["server_cores"],
                    overhead_s=m.overhead_per_round_trip_s * m.round_trips / m.activities,
                )  # fmt: skip
                row["simulated"] = {
                    "rollouts_per_s": sim.rollouts_per_s,
                    "rollout_p50_s": sim.duration_p50_s,
                    "rollout_p95_s": sim.duration_p95_s,
                    "server_utilisation": sim.utilisation,
                    "queue_wait_per_step_ms": round(sim.wait_per_step_s * 1000, 1),
                }
            rows.append(row)
    return {"rows": rows}


def report(runs: dict[str, Any]) -> dict[str, Any]:
    if not ACTIONS.exists():
        raise SystemExit(f"{ACTIONS} is missing: run `python -m bench.actions` first")
    actions = json.loads(ACTIONS.read_text())
    cal = calibrate(runs["runs"])
    validation = {label: predict(run, cal) for label, run in runs["runs"].items()}
    measured = plans(runs["runs"], actions, runs.get("plan", "classic"))
    out = {
        "measured": runs,
        "actions": actions["plans"],
        "calibration": cal,
        "validation": validation,
        "per_rollout": {label: m.__dict__ for label, m in measured.items()},
        "deployment": deployment(measured, runs["runs"]),
    }
    (OUT / "scale.json").write_text(json.dumps(out, indent=2))
    plot(out, OUT / "scale.png")
    print(tables(out))
    print(f"wrote {OUT / 'scale.json'} and {OUT / 'scale.png'}")
    return out


def tables(out: dict[str, Any]) -> str:
    lines = ["| run | concurrency | load1 | cores got | CPU ms/step | measured wall | simulated (calibrated) | error "
             "| simulated (run's CPU) | error |", "|---" * 10 + "|"]  # fmt: skip
    for label, v in out["validation"].items():
        run = out["measured"]["runs"][label]
        lines.append(f"| {label} | {run['concurrency']} | {run['load_before']['load1']}-{run['load_after']['load1']} | "
                     f"{v['run_cores']} | {v['run_cpu_ms_per_step']} | {v['measured_wall_s']} s | "
                     f"{v['predicted_wall_s']} s | {v['error']:+.0%} | {v['given_cpu_wall_s']} s | "
                     f"{v['given_cpu_error']:+.0%} |")  # fmt: skip
    lines += ["", "| plan | C | model s/turn | rollout s | activities/s | DB writes/s | frontend RPS | server cores "
              "| shards SQL / Cassandra | rollouts per shard SQL / Cassandra / per core | DB GB/day retained "
              "| worker processes (nodes) | worker cache GB | Cloud actions/s | x default 500 |",
              "|---" * 15 + "|"]  # fmt: skip
    for r in out["deployment"]["rows"]:
        lines.append(
            f"| {r['plan']} | {r['concurrency']:,} | {r['workload']['model_s']} | {r['rollout_s']} | "
            f"{r['activities_per_s']:,} | {r['db_writes_per_s']:,} | {r['frontend_rps']:,} | {r['server_cores']} | "
            f"{r['shards']} / {r['shards_cassandra']} | {r['rollouts_per_shard_sql']} / "
            f"{r['rollouts_per_shard_cassandra']} / {r['rollouts_per_server_core']} | "
            f"{r['db_gb_per_day']} | {r['worker_processes']} ({r['worker_nodes']}) | {r['worker_cache_gb']} | "
            f"{r['cloud_aps']:,} | {r['cloud_x_default']} |"
        )
    return "\n".join(lines)


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    val = out["validation"]
    labels = list(val)
    x = range(len(labels))
    ax = axes[0]
    ax.bar([i - 0.27 for i in x], [val[k]["measured_wall_s"] for k in labels], 0.27, label="measured")
    ax.bar(list(x), [val[k]["predicted_wall_s"] for k in labels], 0.27, label="simulated, calibrated")
    ax.bar([i + 0.27 for i in x], [val[k]["given_cpu_wall_s"] for k in labels], 0.27, label="simulated, run's CPU")
    ax.set(xticks=list(x), xticklabels=labels, yscale="log", ylabel="wall s", title="this box: measured vs simulated")
    ax.legend()
    cal = out["calibration"]
    ax = axes[1]
    concurrencies = [1, 8, 32, 64, 128, 256, 512, 1024]
    workload = Workload(4, 2.0, TOOL_S)
    sims = [simulate(concurrency=c, rollouts=2 * c, latencies=workload.step_latencies(), service_s=cal["service_s"],
                     servers=1, speed=cal["cores"], overhead_s=cal["overhead_s"])
            for c in concurrencies]  # fmt: skip
    ax.plot(concurrencies, [s.rollouts_per_s for s in sims], "o-", label="simulated, this box")
    ax.plot(concurrencies, [c / workload.ideal_s for c in concurrencies], "k:", label="no orchestration cost")
    run = out["measured"]["runs"].get("realistic")
    if run:
        ax.plot([run["concurrency"]], [run["rollouts_per_s"]], "r*", markersize=12, label="measured")
    ax.set(xscale="log", yscale="log", xlabel="rollouts in flight", ylabel="rollouts/s",
           title="model 2 s, tool 0.1 s, 4 tool turns")  # fmt: skip
    ax.legend()
    ax = axes[2]
    rows = [r for r in out["deployment"]["rows"] if r["concurrency"] == 10_000]
    names = [f"{r['plan']}\n{r['workload']['model_s']:g} s/turn" for r in rows]
    ax.bar(names, [r["cloud_aps"] for r in rows], color="tab:purple")
    ax.axhline(500, color="k", linestyle=":", label="Cloud default 500 APS")
    ax.set(ylabel="Temporal Cloud actions/s", title="10,000 concurrent rollouts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
