"""Fuzzed workflow input from the real `temporal workflow start --input` against the dev server.

Every case ends one of three ways: the CLI refuses it (not JSON), the rollout completes (scored or
flagged infra-failed), or the workflow fails at once with a non-retryable `InvalidInput` error.
A workflow task that fails (and would be retried forever: a stuck workflow) is a test failure.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fuzzing import Driver, Tally, fuzz_settings, hostile_text, hypothesis_in_thread, json_values
from hypothesis import given
from hypothesis import strategies as st
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from gymflow.activities.names import ROLLOUT_WORKFLOW
from gymflow.activities.schema import RolloutResult
from gymflow.workers.servers.temporal import temporal_binary
from gymflow.workers.worker import RunningWorker

STUCK_AFTER_S = 60.0
"""A case not closed by then counts as stuck."""
ARG_LIMIT = 100_000
"""Inputs longer than this go through `--input-file` (Linux refuses single arguments over 128 KiB)."""


def base(url: str) -> dict[str, Any]:
    """A valid input the fuzzer starts from (cheap: in-process tools, one model attempt)."""
    return {
        "env": "math-inproc",
        "task": {"id": "t1", "prompt": "Compute the value of the expression: 2 + 3", "ground_truth": "5"},
        "model": {"base_url": url, "request_timeout_s": 10},
        "limits": {"max_turns": 4, "tool_timeout_s": 10},
        "retry": {"model_attempts": 1, "env_attempts": 1},
    }


def nested_mutation(value: Any) -> st.SearchStrategy[Any]:
    """`value` (an object) with one field replaced, dropped or added."""
    hostile = st.one_of(json_values(), hostile_text(), st.sampled_from([-1, 0, 10**30, 1e308, "", [], {}]))
    if not isinstance(value, dict) or not value:
        return hostile
    return st.one_of(
        st.sampled_from(sorted(value)).flatmap(lambda k: hostile.map(lambda v: {**value, k: v})),
        st.sampled_from(sorted(value)).map(lambda k: {kk: vv for kk, vv in value.items() if kk != k}),
        st.builds(lambda k, v: {**value, k: v}, st.text(max_size=10), hostile),
    )


def workflow_input(url: str) -> st.SearchStrategy[str]:
    """The `--input` text: mutated valid inputs, any JSON, or not JSON at all."""
    valid = base(url)
    mutated = st.one_of(
        nested_mutation(valid),
        st.sampled_from(sorted(valid)).flatmap(lambda k: nested_mutation(valid[k]).map(lambda v: {**valid, k: v})),
    )
    return st.one_of(mutated.map(json.dumps), json_values().map(json.dumps), hostile_text(), st.just(json.dumps(valid)))


async def start_and_settle(
    client: Client, address: str, queue: str, text: str, *, tally: Tally, problems: list[str]
) -> None:
    workflow_id = f"fuzz-input-{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory() as tmp:
        if len(text.encode(errors="surrogatepass")) < ARG_LIMIT and "\x00" not in text:
            source = ["--input", text]
        else:  # past the kernel's limit on one argument (or holding a NUL): the same text from a file
            (Path(tmp) / "input.json").write_bytes(text.encode(errors="surrogatepass"))
            source = ["--input-file", str(Path(tmp) / "input.json")]
        cli = await asyncio.create_subprocess_exec(
            temporal_binary(), "workflow", "start", "--type", ROLLOUT_WORKFLOW, "--task-queue", queue,
            "--workflow-id", workflow_id, *source, "--address", address,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await cli.wait()
    handle = client.get_workflow_handle(workflow_id, result_type=RolloutResult)
    if cli.returncode != 0:
        with pytest.raises(RPCError):  # refused by the CLI: no workflow was started
            await handle.describe()
        tally.case("refused_by_cli")
        return
    outcome, detail = await settle(handle)
    tally.case(outcome)
    if outcome not in ALLOWED:  # kept, not raised: the run goes on and counts every such case
        problems.append(f"{outcome} on {text[:120]!r}: {detail[:200]}")


ALLOWED = {"completed_scored", "completed_infra_failed", "failed_invalid_input", "refused_by_cli"}


async def settle(handle: WorkflowHandle[Any, RolloutResult]) -> tuple[str, str]:
    """How a started rollout ended, and why: `completed_scored`, `completed_infra_failed`,
    `failed_invalid_input` — or `stuck` (a workflow task failed: Temporal retries it forever; the
    workflow is then terminated here) or `failed_otherwise`."""
    deadline = time.monotonic() + STUCK_AFTER_S
    while (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        failed = await failed_tasks(handle)
        if failed or time.monotonic() > deadline:
            await handle.terminate("stuck: its workflow task fails")
            return "stuck", failed[0] if failed else f"still running after {STUCK_AFTER_S:g}s"
        await asyncio.sleep(0.1)
    try:
        result = await handle.result()
    except WorkflowFailureError as exc:
        cause = exc.cause
        if not (isinstance(cause, ApplicationError) and cause.type == "InvalidInput" and cause.non_retryable):
            return "failed_otherwise", f"{type(cause).__name__}: {cause}"
        outcome = "failed_invalid_input"
    else:
        outcome = f"completed_{'infra_failed' if result.infra_failed else 'scored'}"
    failed = await failed_tasks(handle)
    return ("stuck", failed[0]) if failed else (outcome, "")


async def failed_tasks(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Messages of the workflow task failures in the history (a healthy workflow has none)."""
    return [
        e.workflow_task_failed_event_attributes.failure.message
        for e in (await handle.fetch_history()).events
        if e.HasField("workflow_task_failed_event_attributes")
    ]


@pytest.mark.parametrize(
    "examples", [pytest.param(25, id="quick"), pytest.param(250, id="big", marks=pytest.mark.slow)]
)
async def test_fuzzed_cli_input_completes_or_fails_with_invalid_input(
    client: Client, worker: RunningWorker, temporal_address: str, calculator_policy_url: str, examples: int
) -> None:
    tally, problems = Tally(), list[str]()

    @fuzz_settings(examples)
    @given(text=workflow_input(calculator_policy_url))
    def check(driver: Driver, text: str) -> None:
        driver.run(
            start_and_settle(client, temporal_address, worker.task_queue, text, tally=tally, problems=problems),
            timeout_s=120,
        )

    await hypothesis_in_thread(check)
    tally.record("fuzz", f"workflow input -> temporal workflow start --input ({examples} examples)")
    assert not problems, f"{len(problems)} case(s) ended badly:\n" + "\n".join(problems)


OUT_OF_RANGE = {
    # Found by the fuzzer; the input models now bound them. Unbounded, each passed validation and then
    # failed every workflow task or was refused by the server.
    # RetryPolicy.maximum_attempts is an int32: a larger value fails every workflow task.
    "retry.model_attempts": ("retry", "model_attempts", 2**31),
    "retry.env_attempts": ("retry", "env_attempts", 2**31),
    # Timeouts become timedelta / protobuf Durations, which overflow.
    "retry.node_timeout_s": ("retry", "node_timeout_s", 1e308),
    "limits.tool_timeout_s": ("limits", "tool_timeout_s", 1e308),
    "model.request_timeout_s": ("model", "request_timeout_s", 1e308),
    # Search attributes are capped at 2 KB: the server rejects the upsert and terminates the workflow.
    "env": (None, "env", "e" * 3000),
    "model.model": ("model", "model", "m" * 3000),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
async def test_out_of_range_values_fail_as_invalid_input(
    client: Client, worker: RunningWorker, calculator_policy_url: str, case: str
) -> None:
    section, field, value = OUT_OF_RANGE[case]
    payload = base(calculator_policy_url)
    (payload[section] if section else payload)[field] = value
    handle = await client.start_workflow(
        ROLLOUT_WORKFLOW,
        payload,
        id=f"range-{uuid.uuid4().hex[:8]}",
        task_queue=worker.task_queue,
        result_type=RolloutResult,
    )
    assert (await settle(handle))[0] == "failed_invalid_input"
