"""The Temporal Web UI, as a person uses it, in headless Chromium (Debian's `chromium`, driven by playwright).

A batch started with `temporal workflow start --type BatchRolloutWorkflow` runs CRM rollouts; in the
UI we find a rollout by `GymflowEnv`, open it, see its reward (first in the result), a tool call's
summary and result, and the outcome in its current details; then open the batch's report. A fused
math rollout's event list names each tool call with its arguments and result (`calculator.add(a=17,
b=2) -> 19`) without expanding anything, in the full and the compact view. With encryption on, the
same pages show ciphertext until the browser logs in to the codec server (auth on), and decoded
payloads after, the call lines included. Screenshots go to $GYMFLOW_SCREENSHOTS (default: the test's
tmp dir).

Skipped, with the reason, where Chromium or playwright is missing — unless GYMFLOW_UI_TEST_REQUIRE=1
(.ci/run sets it after installing chromium), which turns the skip into a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from leaks import history_text
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import BATCH_WORKFLOW
from gymflow.activities.schema import BatchResult, RolloutInput
from gymflow.envs.builtin.crm.policy import ReferencePolicy
from gymflow.envs.builtin.crm.tasks import generate_tasks, make_task
from gymflow.envs.builtin.math.data import generate_tasks as math_tasks
from gymflow.envs.contract import Trajectory
from gymflow.envs.mcp.http import free_port
from gymflow.workers.client import connect, data_converter
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.codec import generate_key
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.servers.temporal import temporal_binary
from gymflow.workers.worker import RunningWorker, running_worker
from support import make_settings

CHROMIUM = os.environ.get("GYMFLOW_CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("GYMFLOW_UI_TEST_REQUIRE") == "1"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
ROOT = Path(__file__).parents[2]
WAIT_MS = 60_000


def _require_browser() -> None:
    problem = None
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        problem = "playwright for Python is not installed (it is in the dev extra)"
    if problem is None and not os.access(CHROMIUM, os.X_OK):
        problem = f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)"
    if problem is not None:
        if REQUIRED:
            pytest.fail(f"GYMFLOW_UI_TEST_REQUIRE=1 but {problem}")
        pytest.skip(problem)


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """Headless Chromium from the system (never a downloaded browser)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            await browser.close()


def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("GYMFLOW_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


async def visible(page: Any, text: str) -> Any:
    """The first visible element with `text` (the UI keeps hidden copies of many labels)."""
    locator = page.locator(f"text={text} >> visible=true").first
    await locator.wait_for(timeout=WAIT_MS)
    return locator


async def in_frames(page: Any, text: str) -> None:
    """Wait for `text` in the page or one of its frames (the UI renders user metadata, Markdown, in an iframe)."""
    deadline = asyncio.get_running_loop().time() + WAIT_MS / 1000
    while True:
        for frame in page.frames:
            with contextlib.suppress(Exception):  # a frame may navigate or detach while we read it
                if text in await frame.inner_text("body", timeout=1000):
                    return
        assert asyncio.get_running_loop().time() < deadline, f"{text!r} never appeared"
        await asyncio.sleep(0.25)


async def open_rollout(page: Any, web_ui: str, query: str, workflow_id: str) -> None:
    """Find a rollout through a search-attribute query, open it and show its event history."""
    await page.goto(f"{web_ui}/namespaces/default/workflows?query={quote(query)}")
    await page.get_by_role("link", name=workflow_id, exact=True).first.click(timeout=WAIT_MS)
    await page.get_by_role("tab", name="Event History").click(timeout=WAIT_MS)
    await visible(page, "Workflow Execution Completed")


async def math_rollout(client: Client, task_queue: str, policy_url: str) -> Trajectory:
    """A fused math rollout of a task the calculator policy solves in two tool calls."""
    task = math_tasks(1, seed=3)[0]  # 10 * 18 / 3
    model = ModelConfig(base_url=policy_url, model="calculator")
    workflow_id = f"ui-math-{uuid.uuid4().hex[:8]}"
    result = await run_rollout(
        client, RolloutInput(env="math", task=task, model=model), task_queue=task_queue, workflow_id=workflow_id
    )
    assert result.reward is not None and result.reward.total == 1.0 and result.turns == 3 and result.tool_calls == 2
    return result


def expected_call_lines(result: Trajectory) -> list[str]:
    """Each tool call of a math rollout, as the event list should name it, with the calculator's answer."""
    answers = {m.tool_call_id: m.content for m in result.messages if m.role == "tool"}
    lines = []
    for call in (c for m in result.messages for c in m.tool_calls):
        assert all(isinstance(v, int) for v in call.arguments.values()) and float(answers[call.id])
        arguments = ", ".join(f"{k}={v}" for k, v in call.arguments.items())
        lines.append(f"calculator.{call.name}({arguments}) -> {answers[call.id]}")
    return lines


async def rows_show(page: Any, lines: list[str]) -> None:
    """Each line is in some event row as the list shows it, nothing expanded: a result's head in
    quotes (a call line whole, not the start of a longer one)."""
    rows = page.locator('[data-testid="event-summary-row"] >> visible=true')
    for line in lines:
        await rows.filter(has_text=f'"{line}"').first.wait_for(timeout=WAIT_MS)
    assert not await page.locator('[data-testid="event-summary-row-expanded"]').count()


async def start_batch_with_temporal_cli(address: str, queue: str, batch_id: str, policy_url: str) -> None:
    payload = {
        "env": "crm",
        "tasks": [t.model_dump(mode="json") for t in generate_tasks(3, seed=0)],
        "options": {"model": {"base_url": policy_url, "model": "reference"}},
        "label": "reference",
    }
    command = [
        temporal_binary(), "workflow", "start", "--type", BATCH_WORKFLOW, "--task-queue", queue,
        "--workflow-id", batch_id, "--input", json.dumps(payload), "--address", address,
    ]  # fmt: skip
    # In a thread: the policy endpoint and the worker answer from this event loop meanwhile.
    await asyncio.to_thread(subprocess.run, command, check=True, capture_output=True, timeout=60)


@pytest.mark.heavy
async def test_rollout_page_and_batch_report(
    client: Client, worker: RunningWorker, web_ui: str, temporal_address: str, tmp_path: Path
) -> None:
    _require_browser()
    batch_id = f"ui-batch-{uuid.uuid4().hex[:8]}"
    async with PolicyServer(ReferencePolicy()) as policy:
        await start_batch_with_temporal_cli(temporal_address, worker.task_queue, batch_id, policy.url)
        result = await client.get_workflow_handle(batch_id, result_type=BatchResult).result()
    assert result.completed == 3 and result.mean_reward == 1.0
    assert result.report is not None and result.report.endswith(f"{batch_id}/report.html")
    rollout = f"{batch_id}/r0"
    out = shots(tmp_path)
    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 1400, "height": 1000})
        await open_rollout(page, web_ui, f'GymflowEnv="crm" AND GymflowBatch="{batch_id}"', rollout)
        body = await page.inner_text("body")
        outcome = body[body.index("Result") :]
        assert outcome.index('"reward"') < outcome.index('"messages"')  # reward first in the result
        assert '"total": 1' in outcome and '"termination": "final_answer"' in outcome
        await page.screenshot(path=str(out / "rollout.png"))

        await page.get_by_role("button", name="Compact").click()
        # crm fuses its turns: one play_turn activity per turn, its result the call lines, each call's
        # result as the tool returned it, then the model's reply with its tool calls.
        await visible(page, "play_turn")
        summary = page.locator("text=play_turn >> visible=true").last  # newest first: the last is turn 1
        await summary.click()
        await visible(page, "search_accounts")
        await visible(page, '\\"accounts\\":[{\\"account_id\\"')
        await page.set_viewport_size({"width": 1400, "height": 2000})  # the call and its result in one picture
        await summary.scroll_into_view_if_needed()
        await page.screenshot(path=str(out / "rollout-tool-call.png"))
        await page.set_viewport_size({"width": 1400, "height": 1000})

        await page.get_by_role("tab", name="User Metadata").click()
        await in_frames(page, "reward 1.000 · final_answer · 3 turn(s), 2 tool call(s)")  # current details
        await in_frames(page, f"crm rollout of task {generate_tasks(1, seed=0)[0].id}")  # its summary

        report = await browser.new_page(viewport={"width": 1100, "height": 900})
        await report.goto(result.report)
        await visible(report, "Evaluation — crm: reference")
        assert await report.locator("svg").count() >= 3
        await report.screenshot(path=str(out / "report.png"), full_page=True)
        await report.get_by_role("link", name=batch_id).click()  # the batch's rollouts, in the Web UI
        await report.get_by_role("link", name=rollout, exact=True).first.wait_for(timeout=WAIT_MS)
        assert report.url.startswith(f"{web_ui}/namespaces/default/workflows?query=")


@pytest.mark.heavy
async def test_a_fused_math_rollout_lists_its_tool_calls_and_results(
    client: Client, worker: RunningWorker, web_ui: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    _require_browser()
    result = await math_rollout(client, worker.task_queue, calculator_policy_url)
    lines = expected_call_lines(result)
    assert lines[0].startswith("calculator.multiply(a=10, b=18) -> 180")
    async with chromium() as browser:
        # As wide as a laptop's screen: narrower, the UI's own layout clips every row's details.
        page = await browser.new_page(viewport={"width": 1600, "height": 1050})
        await open_rollout(page, web_ui, f'WorkflowId="{result.rollout_id}"', result.rollout_id)
        await rows_show(page, lines)  # each play_turn's completion event: its result's head
        await page.get_by_role("button", name="Compact").click()
        await rows_show(page, lines)  # one row per turn: activity type, attempt, the result's head
        await page.screenshot(path=str(shots(tmp_path) / "rollout-fused-calls.png"))


@contextlib.contextmanager
def codec_server(key: str, auth: str, origin: str) -> Any:
    """`gymflow codec-server` as a user starts it, allowing the session UI's origin; yields its URL."""
    port = free_port()
    env = {**os.environ, "GYMFLOW_ENCRYPTION_KEY": key, "GYMFLOW_CODEC_AUTH": auth, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "gymflow.workers.cli", "codec-server", "--port", str(port), "--origin", origin],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        assert "auth required" in process.stderr.readline()  # printed just before it serves
        yield f"http://localhost:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow  # the codec itself: tests/workers/test_codec.py; the browser: the other tests here
async def test_encrypted_rollout_is_read_through_the_codec_server_with_auth(
    client: Client, web_ui: str, temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    _require_browser()
    key, auth = generate_key(), f"Bearer ui-codec-{uuid.uuid4().hex}"
    settings = make_settings(tmp_path, encryption_key=key, codec_auth=auth)
    encrypting = await connect(temporal_address, data_converter=data_converter(settings))
    task = make_task(0, 2)  # a knowledge-base question
    rollout = f"ui-encrypted-{uuid.uuid4().hex[:8]}"
    async with running_worker(encrypting, settings), PolicyServer(ReferencePolicy()) as policy:
        model = ModelConfig(base_url=policy.url, model="reference")
        result = await run_rollout(
            encrypting,
            RolloutInput(env="crm", task=task, model=model),
            task_queue=settings.task_queue,
            workflow_id=rollout,
        )
        fused = await math_rollout(encrypting, settings.task_queue, calculator_policy_url)
    assert result.reward is not None and result.reward.total == 1.0
    lines = expected_call_lines(fused)
    stored = history_text(await client.get_workflow_handle(fused.rollout_id).fetch_history())
    assert not any(line in stored for line in lines) and "calculator." not in stored  # ciphertext only
    question = str(task.prompt).splitlines()[1][:40]
    out = shots(tmp_path)
    with codec_server(key, auth, origin=web_ui) as codec:
        async with chromium() as browser:
            profile = await browser.new_context(viewport={"width": 1400, "height": 1000})  # one person's browser
            page = await profile.new_page()
            await open_rollout(page, web_ui, f'WorkflowId="{rollout}"', rollout)
            assert question not in await page.inner_text("body")  # the server holds ciphertext only

            # The UI's codec setting: this browser's endpoint, with cross-origin credentials (the cookie).
            await page.get_by_test_id("data-encoder-status").click()
            await page.get_by_test_id("use-local-endpoint-input").click()
            await page.get_by_test_id("data-encoder-endpoint-input").fill(codec)
            await page.get_by_test_id("data-encoder-include-credentials").click()
            assert await page.locator("#pass-access-credentials").is_checked()
            await page.get_by_test_id("confirm-modal-button").filter(visible=True).click()
            await page.reload()
            await visible(page, "Workflow Execution Completed")
            assert question not in await page.inner_text("body")  # not logged in: the codec says 401

            login = await profile.new_page()  # the same profile: the UI will send the cookie set here
            await login.goto(f"{codec}/login")
            await login.fill("input[name=auth]", "wrong")
            await login.click("button[type=submit]")
            await visible(login, "Wrong value")
            await login.fill("input[name=auth]", auth)
            await login.click("button[type=submit]")
            await visible(login, "Logged in")

            await page.reload()
            await visible(page, question)  # decoded through the codec server, auth on
            body = await page.inner_text("body")
            assert '"total": 1' in body and "db_unchanged" in body
            await page.screenshot(path=str(out / "rollout-encrypted-decoded.png"))

            # A fused math rollout's call lines, decoded the same way, in the list and the compact view.
            await open_rollout(page, web_ui, f'WorkflowId="{fused.rollout_id}"', fused.rollout_id)
            await rows_show(page, lines)
            await page.get_by_role("button", name="Compact").click()
            await rows_show(page, lines)
