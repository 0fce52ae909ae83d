"""The scale model of gymflow on Temporal: a deployment sizing on paper and a discrete-event simulation.

Pure (no I/O), so the tests check its arithmetic; `bench.scale` feeds it measured figures.

**On paper** (`size`): C rollouts in flight, each of duration T (turns x (model + tool latency) plus
an orchestration overhead per step) and A actions, give an action rate of C * A / T. The
server's measured CPU per activity step turns that into cores; its measured mutable-state
transitions per rollout (each a persistence write on the workflow's history shard) into shards,
since a shard applies its writes one at a time ("Temporal serializes all updates belonging to the
same shard ... the latency of a database operation limits the maximum theoretical throughput of a
single shard", planetscale.com/blog/temporal-workflows-at-scale-sharding-in-production;
`history.shardIOConcurrency` defaults to 1 and cannot exceed 1 on Cassandra,
community.temporal.io/t/temporal-shards-configured-in-shards-table/15533). The worker side:
one activity slot per rollout in a model turn, the workflow cache's memory per open rollout,
the worker's CPU per step. Temporal Cloud: billable actions per rollout (bench.actions, plus the
model turns' heartbeats) times the rollout rate, against the namespace's default 500 actions per
second (docs.temporal.io/cloud/limits).

**Simulation** (`simulate`): rollouts as sequences of steps; each step needs `service_s` of CPU
on one of `servers` identical servers of speed `speed` (FIFO), then waits `overhead_s` (round
trips, polls) plus the step's own latency (model turn, tool call) off the CPU. C rollouts start
at once (a training batch does) and each finished rollout starts the next one while any are left.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

CLOUD_DEFAULT_APS = 500
"""Temporal Cloud's default namespace limit, actions per second (docs.temporal.io/cloud/limits)."""


@dataclass(frozen=True)
class Workload:
    """One rollout's shape."""

    tool_turns: int = 4
    model_s: float = 2.0
    tool_s: float = 0.1

    def step_latencies(self, plan: str = "classic") -> list[float]:
        """Off-CPU latency after each activity step of a rollout, by plan (bench.actions.PLANS).

        classic: init, (model, tool) x turns, model, reward. local: the model turns run in the
        workflow's own tasks, between init, the tool calls and the reward. fused: init, then one
        activity per turn (model and tool call; the last one with the reward)."""
        m, t, k = self.model_s, self.tool_s, self.tool_turns
        if plan == "fused":
            return [0.0] + [m + t] * k + [m]
        if plan == "local":
            return [m] + [t + m] * k + [0.0]
        return [0.0] + [m, t] * k + [m, 0.0]

    @property
    def ideal_s(self) -> float:
        """The rollout's duration with free orchestration: model and tool latency only."""
        return (self.tool_turns + 1) * self.model_s + self.tool_turns * self.tool_s


@dataclass(frozen=True)
class Measured:
    """Per-rollout figures of one rollout plan, measured here (bench.actions, bench.scale)."""

    activities: int
    """Activity steps per rollout (11 for 4 tool turns, classic plan)."""
    round_trips: int
    """Workflow tasks per rollout: each one a worker -> server -> worker round trip on the rollout's path."""
    state_transitions: int
    """Mutable-state transitions (persistence writes on the shard) per rollout."""
    billable_actions: int
    """Temporal Cloud actions per rollout from history (heartbeats excluded)."""
    heartbeating_turns: int
    """Model turns run as activities (they heartbeat once they run past ~3.3 s; local ones do not)."""
    server_cpu_per_transition_s: float
    """The server's CPU per state transition (its CPU per rollout over the rollout's transitions)."""
    worker_cpu_per_rollout_s: float
    overhead_per_round_trip_s: float
    """Off-CPU orchestration latency per round trip at light load (polls, transfer queue)."""
    worker_mb_per_rollout: float
    db_bytes_per_rollout: float
    server_cpu_per_heartbeat_s: float = 0.0
    """The server's CPU per activity heartbeat that reaches it (slow model turns heartbeat)."""


@dataclass(frozen=True)
class Assumptions:
    """What is not measured here: a production cluster's figures, stated, to be replaced by yours."""

    persistence_write_s: float = 0.005
    """Latency of one shard write (SQL on a good disk: a few ms)."""
    cassandra_write_s: float = 0.010
    """The same on Cassandra, where each write is a lightweight transaction (Paxos round trips)."""
    shard_utilisation: float = 0.5
    """Keep shards at most half busy: a busy shard queues every workflow hashed to it."""
    cpu_utilisation: float = 0.7
    """Target CPU utilisation of server and worker cores."""
    worker_slots: int = 256
    """Activity slots per worker process (Settings.max_concurrent_activities)."""
    cores_per_worker: float = 1.0
    """A Python worker process uses about one core (one event loop, the GIL)."""
    cores_per_node: int = 16
    heartbeat_every_s: float = 10 / 3


def heartbeats_per_turn(model_s: float, a: Assumptions) -> int:
    """Heartbeats of one model turn of `model_s` seconds that reach the server, each a state transition.

    gymflow.activities.model and gymflow.activities.turn heartbeat every third of their 10 s heartbeat timeout, and
    every one of them reached the server (bench.actions --probe: turns of 5, 12 and 20 s added 1, 3
    and 5 state transitions each), the SDK's throttling to 80 % of the timeout notwithstanding."""
    return max(0, math.ceil(model_s / a.heartbeat_every_s - 1e-9) - 1)


def per_unit(workload: Workload, m: Measured, a: Assumptions = Assumptions()) -> dict[str, float]:
    """Concurrent rollouts one history shard (SQL, Cassandra) and one server core sustain at this workload."""
    duration = workload.ideal_s + m.round_trips * m.overhead_per_round_trip_s
    heartbeats = m.heartbeating_turns * heartbeats_per_turn(workload.model_s, a)
    writes = (m.state_transitions + heartbeats) / duration  # per rollout in flight, per second
    cpu = (m.state_transitions * m.server_cpu_per_transition_s + heartbeats * m.server_cpu_per_heartbeat_s) / duration
    return {
        "rollouts_per_shard_sql": round(a.shard_utilisation / a.persistence_write_s / writes),
        "rollouts_per_shard_cassandra": round(a.shard_utilisation / a.cassandra_write_s / writes),
        "rollouts_per_server_core": round(a.cpu_utilisation / cpu),
        "writes_per_rollout": m.state_transitions + heartbeats,
    }


def pow2(n: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, n))))


def size(concurrency: int, workload: Workload, m: Measured, a: Assumptions = Assumptions()) -> dict[str, Any]:
    """The deployment C concurrent rollouts of `workload` need, from measured per-rollout figures."""
    duration = workload.ideal_s + m.round_trips * m.overhead_per_round_trip_s
    rollouts_per_s = concurrency / duration
    transitions_per_s = rollouts_per_s * m.state_transitions
    heartbeats = m.heartbeating_turns * heartbeats_per_turn(workload.model_s, a)
    heartbeats_per_s = rollouts_per_s * heartbeats
    writes_per_s = transitions_per_s + heartbeats_per_s  # a heartbeat updates the activity's mutable state
    cloud = m.billable_actions + heartbeats
    cloud_aps = rollouts_per_s * cloud
    server_cpu = transitions_per_s * m.server_cpu_per_transition_s + heartbeats_per_s * m.server_cpu_per_heartbeat_s
    server_cores = server_cpu / a.cpu_utilisation
    per_shard = a.shard_utilisation / a.persistence_write_s  # writes/s one shard sustains
    shards = pow2(writes_per_s / per_shard * 4)  # x4 headroom: hashing skew, bursts, growth
    worker_cores = rollouts_per_s * m.worker_cpu_per_rollout_s / a.cpu_utilisation
    workers = max(math.ceil(concurrency / a.worker_slots), math.ceil(worker_cores / a.cores_per_worker))
    return {
        "concurrency": concurrency,
        "workload": asdict(workload),
        "rollout_s": round(duration, 2),
        "rollouts_per_s": round(rollouts_per_s, 1),
        "activities_per_s": round(rollouts_per_s * m.activities),
        "workflow_tasks_per_s": round(rollouts_per_s * m.round_trips),
        "state_transitions_per_s": round(transitions_per_s),
        "heartbeats_per_s": round(heartbeats_per_s),
        "server_cores": math.ceil(server_cores),
        "shards_min": math.ceil(writes_per_s / per_shard),
        "shards": shards,
        "rollouts_per_shard": round(concurrency / shards, 1),
        "db_writes_per_s": round(writes_per_s),
        "shards_cassandra": pow2(writes_per_s * a.cassandra_write_s / a.shard_utilisation * 4),
        "frontend_rps": round(rollouts_per_s * (2 * m.activities + 2 * m.round_trips + 2) + heartbeats_per_s),
        "db_gb_per_day": round(rollouts_per_s * 86400 * m.db_bytes_per_rollout / 1e9, 1),
        "worker_cores": math.ceil(worker_cores),
        "worker_processes": workers,
        "worker_nodes": math.ceil(workers * a.cores_per_worker / a.cores_per_node),
        "worker_cache_gb": round(concurrency * m.worker_mb_per_rollout / 1024, 1),
        "cloud_actions_per_rollout": cloud,
        "cloud_aps": round(cloud_aps),
        "cloud_fits_default": cloud_aps <= CLOUD_DEFAULT_APS,
        "cloud_x_default": round(cloud_aps / CLOUD_DEFAULT_APS, 1),
    }


@dataclass
class SimResult:
    wall_s: float
    rollouts: int
    rollouts_per_s: float
    steps_per_s: float
    duration_p50_s: float
    duration_p95_s: float
    wait_per_step_s: float
    """Mean time a step queued for a server."""
    utilisation: float


def simulate(
    *,
    concurrency: int,
    rollouts: int,
    latencies: Sequence[float],
    service_s: float,
    servers: int,
    speed: float = 1.0,
    overhead_s: float = 0.0,
    seed: int = 0,
    exponential: bool = True,
) -> SimResult:
    """Run `rollouts` rollouts, `concurrency` at a time, each step: CPU on a FIFO server, then off-CPU latency.

    Args:
        latencies: Off-CPU latency of each step of a rollout (Workload.step_latencies).
        service_s: CPU seconds per step (at speed 1).
        servers, speed: `servers` servers each running at `speed` (2 servers at 0.8: 1.6 cores' worth).
        overhead_s: Off-CPU latency added to every step.
        exponential: Exponential service times (seeded) instead of fixed ones.
    """
    sim = _Simulation(latencies, service_s, servers, speed, overhead_s, random.Random(seed), exponential)
    for _ in range(min(concurrency, rollouts)):
        sim.launch(0.0)
    while sim.events:
        clock, _, rollout, kind = heapq.heappop(sim.events)
        if kind == _ARRIVE:
            sim.queue.append((clock, rollout))
        else:
            sim.free += 1
            finished = sim.step_done(clock, rollout)
            if finished is not None and sim.launched < rollouts:
                sim.launch(finished)
        sim.dispatch(clock)
    wall, durations, steps = sim.end, sorted(sim.durations), len(latencies)
    return SimResult(
        wall_s=round(wall, 3),
        rollouts=len(durations),
        rollouts_per_s=round(len(durations) / wall, 3) if wall else 0.0,
        steps_per_s=round(len(durations) * steps / wall, 2) if wall else 0.0,
        duration_p50_s=round(durations[len(durations) // 2], 3),
        duration_p95_s=round(durations[min(len(durations) - 1, round(0.95 * (len(durations) - 1)))], 3),
        wait_per_step_s=round(sim.waited / max(1, len(durations) * steps), 4),
        utilisation=round(sim.busy / (servers * wall), 3) if wall else 0.0,
    )


_ARRIVE, _DONE = 0, 1


@dataclass
class _Simulation:
    latencies: Sequence[float]
    service_s: float
    free: int
    speed: float
    overhead_s: float
    rng: random.Random
    exponential: bool
    events: list[tuple[float, int, int, int]] = field(default_factory=list)
    """(time, sequence, rollout, _ARRIVE at the CPU queue or _DONE with the CPU)."""
    queue: deque[tuple[float, int]] = field(default_factory=deque)
    step_of: dict[int, int] = field(default_factory=dict)
    started_at: dict[int, float] = field(default_factory=dict)
    durations: list[float] = field(default_factory=list)
    launched: int = 0
    seq: int = 0
    waited: float = 0.0
    busy: float = 0.0
    end: float = 0.0

    def push(self, at: float, rollout: int, kind: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, rollout, kind))

    def launch(self, at: float) -> None:
        self.step_of[self.launched], self.started_at[self.launched] = 0, at
        self.push(at, self.launched, _ARRIVE)
        self.launched += 1

    def step_done(self, clock: float, rollout: int) -> float | None:
        """After a step's CPU: its latency, then the next step; returns the end time of a finished rollout."""
        step = self.step_of[rollout]
        after = clock + self.overhead_s + self.latencies[step]
        if step + 1 < len(self.latencies):
            self.step_of[rollout] = step + 1
            self.push(after, rollout, _ARRIVE)
            return None
        self.durations.append(after - self.started_at.pop(rollout))
        self.end = max(self.end, after)
        return after

    def dispatch(self, clock: float) -> None:
        while self.free and self.queue:
            arrived, rollout = self.queue.popleft()
            self.waited += clock - arrived
            self.free -= 1
            work = (self.rng.expovariate(1 / self.service_s) if self.exponential else self.service_s) / self.speed
            self.busy += work
            self.push(clock + work, rollout, _DONE)
