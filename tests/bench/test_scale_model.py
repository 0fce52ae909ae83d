"""The scale model's arithmetic: the simulation at low load and at saturation, the sizing formulas."""

from __future__ import annotations

import pytest

from bench.scale_model import Assumptions, Measured, Workload, heartbeats_per_turn, pow2, simulate, size

WORKLOAD = Workload(tool_turns=4, model_s=2.0, tool_s=0.1)


def test_one_rollout_at_a_time_takes_its_latencies_plus_service_and_overhead_per_step() -> None:
    latencies = WORKLOAD.step_latencies()
    assert len(latencies) == 11 and sum(latencies) == pytest.approx(WORKLOAD.ideal_s)
    result = simulate(concurrency=1, rollouts=3, latencies=latencies, service_s=0.01, servers=2, overhead_s=0.02,
                      exponential=False)  # fmt: skip
    per_rollout = WORKLOAD.ideal_s + 11 * (0.01 + 0.02)
    assert result.duration_p50_s == pytest.approx(per_rollout)
    assert result.wall_s == pytest.approx(3 * per_rollout)
    assert result.wait_per_step_s == 0.0


@pytest.mark.parametrize(("plan", "steps"), [("classic", 11), ("local", 6), ("fused", 6)])
def test_every_plan_waits_for_the_same_model_and_tools(plan: str, steps: int) -> None:
    latencies = WORKLOAD.step_latencies(plan)
    assert len(latencies) == steps  # the activities bench.actions counts for the plan
    assert sum(latencies) == pytest.approx(WORKLOAD.ideal_s)


def test_low_load_is_close_to_ideal() -> None:
    result = simulate(concurrency=100, rollouts=300, latencies=WORKLOAD.step_latencies(), service_s=0.001, servers=8)
    assert result.duration_p50_s == pytest.approx(WORKLOAD.ideal_s, rel=0.01)
    assert result.utilisation < 0.2


@pytest.mark.parametrize(("servers", "speed"), [(1, 1.0), (2, 1.0), (4, 0.5), (1, 0.7)])
def test_saturated_throughput_is_capacity_over_service_time(servers: int, speed: float) -> None:
    steps, service_s = 11, 0.01
    result = simulate(concurrency=200, rollouts=1000, latencies=[0.0] * steps, service_s=service_s,
                      servers=servers, speed=speed)  # fmt: skip
    assert result.steps_per_s == pytest.approx(servers * speed / service_s, rel=0.03)
    assert result.utilisation > 0.97
    assert result.wait_per_step_s > 0.1  # 200 rollouts queue for the servers


def test_a_slow_model_hides_the_server_until_the_action_rate_reaches_its_capacity() -> None:
    slow = Workload(4, 20.0, 0.1)
    capacity_steps_per_s = 1 / 0.01
    below = simulate(concurrency=100, rollouts=100, latencies=slow.step_latencies(), service_s=0.01, servers=1)
    above = simulate(concurrency=2000, rollouts=2000, latencies=slow.step_latencies(), service_s=0.01, servers=1)
    assert 100 * 11 / slow.ideal_s < capacity_steps_per_s < 2000 * 11 / slow.ideal_s
    assert below.duration_p50_s < slow.ideal_s * 1.1
    assert above.steps_per_s <= capacity_steps_per_s * 1.02
    assert above.duration_p50_s > slow.ideal_s * 1.5


def measured(**overrides: float) -> Measured:
    values: dict[str, float] = {
        "activities": 11,
        "round_trips": 12,
        "state_transitions": 41,
        "billable_actions": 14,
        "heartbeating_turns": 5,
        "server_cpu_per_transition_s": 0.003,
        "worker_cpu_per_rollout_s": 0.07,
        "overhead_per_round_trip_s": 0.02,
        "worker_mb_per_rollout": 0.2,
        "db_bytes_per_rollout": 50_000,
    }
    return Measured(**(values | overrides))  # type: ignore[arg-type]


def test_size_is_rate_times_cost() -> None:
    m = measured()
    row = size(10_000, WORKLOAD, m)
    duration = WORKLOAD.ideal_s + 12 * 0.02
    assert row["rollout_s"] == pytest.approx(duration, abs=0.01)
    assert row["activities_per_s"] == round(10_000 * 11 / duration)
    assert row["state_transitions_per_s"] == round(10_000 * 41 / duration)
    assert row["server_cores"] == pytest.approx(10_000 * 41 / duration * 0.003 / 0.7, abs=1)
    # 2 s turns never heartbeat: Cloud actions are the history's
    assert row["cloud_actions_per_rollout"] == 14
    assert row["cloud_aps"] == round(10_000 * 14 / duration)
    assert not row["cloud_fits_default"]
    a = Assumptions()
    per_shard = a.shard_utilisation / a.persistence_write_s
    assert row["shards"] == pow2(row["state_transitions_per_s"] / per_shard * 4)
    assert row["worker_processes"] >= 10_000 / a.worker_slots


def test_slow_turns_heartbeat_and_a_small_load_fits_the_cloud_default() -> None:
    assert heartbeats_per_turn(2.0, Assumptions()) == 0
    # every 3.3 s while the turn runs (measured: 5, 12, 20 s turns added 1, 3, 5 transitions each)
    assert [heartbeats_per_turn(s, Assumptions()) for s in (3.0, 5.0, 12.0, 20.0)] == [0, 1, 3, 5]
    row = size(100, Workload(4, 20.0, 0.1), measured())
    assert row["cloud_actions_per_rollout"] == 14 + 5 * 5
    assert row["cloud_fits_default"]
    assert pow2(1) == 1 and pow2(3) == 4 and pow2(1024) == 1024
