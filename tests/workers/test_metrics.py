"""A worker's /metrics, scraped over real HTTP and read by the Prometheus text parser during a batch.

The worker runs with a metrics runtime (what `gymflow worker --metrics-port` builds): the SDK's
own series and gymflow's on one endpoint. A batch of math rollouts (and one whose model endpoint
is down, an infra failure) must move gymflow's series between scrapes: rollouts by env and status,
rewards, infra failures by reason, model-call latency and tokens, tool calls, admission waits,
live rollouts and servers. deploy/grafana-dashboard.json must be valid JSON whose every query
names a series this worker exports.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RetrySettings, RolloutInput
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.mcp.http import free_port
from gymflow.workers import metrics as gm
from gymflow.workers.client import connect
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.worker import running_worker
from support import make_settings

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana-dashboard.json"
ROLLOUTS = 6


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of the endpoint: name -> {sorted labels (without `node`): value}."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("node", "service_name")))
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


def total(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for key, v in samples.get(name, {}).items() if wanted <= set(key))


def dashboard_metrics() -> set[str]:
    """Metric names the dashboard's queries read (histogram suffixes kept as written)."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    names: set[str] = set()
    for expr in exprs:
        names |= set(re.findall(r"\b((?:gymflow|temporal)_[a-z_]+)\b", expr))
    return names


@pytest.mark.heavy
async def test_a_worker_exports_gymflow_and_sdk_metrics_that_move_during_a_batch(
    temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    port = free_port()
    settings = make_settings(tmp_path, metrics_port=port, mcp_pool_size=1)
    runtime = gm.metrics_runtime(host="127.0.0.1", port=port, node=settings.node_id)
    client: Client = await connect(temporal_address, runtime=runtime)
    url = f"http://127.0.0.1:{port}/metrics"
    tasks = generate_tasks(ROLLOUTS, seed=5)
    async with running_worker(client, settings):
        before = await asyncio.to_thread(scrape, url)
        handles = [
            await start_rollout(
                client,
                RolloutInput(env="math", task=task, model=ModelConfig(base_url=calculator_policy_url)),
                task_queue=settings.task_queue,
                workflow_id=f"metrics-{uuid.uuid4().hex[:8]}",
            )
            for task in tasks
        ]
        down = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: the rollout infra-fails
        failing = await start_rollout(
            client,
            RolloutInput(
                env="math", task=tasks[0], model=ModelConfig(base_url=down), retry=RetrySettings(model_attempts=1)
            ),
            task_queue=settings.task_queue,
        )
        seen_live = 0.0
        during: list[float] = []
        pending = [asyncio.ensure_future(h.result()) for h in [*handles, failing]]
        while not all(p.done() for p in pending):  # scrape while the batch runs
            now = await asyncio.to_thread(scrape, url)
            seen_live = max(seen_live, total(now, gm.LIVE_ROLLOUTS), total(now, gm.LIVE_SERVERS))
            during.append(total(now, "gymflow_rollouts_total"))
            await asyncio.wait(pending, timeout=0.3)
        results = [p.result() for p in pending]
        assert not results[-1].reward and results[-1].infra_failed
        after = await asyncio.to_thread(scrape, url)

    completed = sum(not r.infra_failed for r in results)
    assert completed == ROLLOUTS
    assert total(before, "gymflow_rollouts_total") == 0
    assert total(after, "gymflow_rollouts_total", env="math", status="completed") == ROLLOUTS
    assert total(after, "gymflow_rollouts_total", env="math", status="infra_failed") == 1
    assert total(after, "gymflow_infra_failures_total", env="math", reason="model_error") == 1
    assert total(after, "gymflow_rollout_reward_count", env="math") == ROLLOUTS
    assert total(after, "gymflow_rollout_reward_sum", env="math") == sum(r.reward.total for r in results if r.reward)
    assert total(after, "gymflow_rollout_duration_seconds_count") == ROLLOUTS + 1
    turns = sum(r.turns for r in results)
    assert total(after, "gymflow_model_call_seconds_count") == turns  # generate, or play_turn (math fuses turns)
    assert total(after, "gymflow_model_tokens_total", kind="completion") > 0
    assert total(after, "gymflow_tool_calls_total", outcome="ok") == sum(r.tool_calls for r in results)
    assert total(after, "gymflow_admission_wait_seconds_count", step="start") >= ROLLOUTS  # every server start
    assert seen_live > 0, "no live rollout or server was ever sampled during the batch"
    assert (during == sorted(during) and during[-1] > during[0]) or during[-1] == ROLLOUTS + 1, during
    # The SDK's own runtime metrics on the same endpoint.
    assert total(after, "temporal_workflow_completed_total") >= ROLLOUTS
    assert total(after, "temporal_activity_execution_latency_count") > 0

    exported = set(after) | {re.sub(r"_(bucket|sum|count)$", "", n) for n in after}
    missing = sorted(dashboard_metrics() - exported)
    assert not missing, f"the dashboard queries series no worker exports: {missing}"


def test_every_listed_gymflow_metric_is_on_the_dashboard() -> None:
    """The dashboard reads every gymflow series (METRICS lists them with their Prometheus names)."""
    used = dashboard_metrics()
    unused = [name for name in gm.METRICS if not any(u == name or u.startswith(f"{name}_") for u in used)]
    assert not unused, f"series on no dashboard panel: {unused}"


def test_a_taken_metrics_port_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(gm.MetricsPortError, match=f"127.0.0.1:{port}"):
            gm.metrics_runtime(host="127.0.0.1", port=port, node="n")
