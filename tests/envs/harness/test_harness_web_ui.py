"""A harness rollout in the Temporal Web UI, as a person reads it (headless Chromium, driven by playwright):
its program's run and each of its model calls are activities with their summaries.

Skipped, with the reason, where Chromium or playwright is missing, unless GYMFLOW_UI_TEST_REQUIRE=1.
The screenshot goes to $GYMFLOW_SCREENSHOTS (default: the test's tmp dir).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from harness_support import AGENTS, FileTaskPolicy, agent_python, file_task, harness_env_file
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker

CHROMIUM = os.environ.get("GYMFLOW_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
WAIT_MS = 60_000


def require_browser() -> None:
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        problem: str | None = "playwright for Python is not installed (it is in the dev extra)"
    else:
        problem = None if os.access(CHROMIUM, os.X_OK) else f"no Chromium at {CHROMIUM}"
    if problem is not None:
        if os.environ.get("GYMFLOW_UI_TEST_REQUIRE") == "1":
            pytest.fail(f"GYMFLOW_UI_TEST_REQUIRE=1 but {problem}")
        pytest.skip(problem)


async def test_each_model_call_is_an_activity_with_its_summary(
    client: Client, worker: RunningWorker, web_ui: str, tmp_path: Path
) -> None:
    require_browser()
    from playwright.async_api import async_playwright

    workflow_id = f"ui-harness-{uuid.uuid4().hex[:8]}"
    env = harness_env_file(tmp_path, [str(agent_python()), str(AGENTS / "openai_agent.py")])
    async with PolicyServer(FileTaskPolicy(), model_name="qwen3-8b") as upstream:
        result = await run_rollout(
            client,
            RolloutInput(
                env=str(env), task=file_task(0, prefix="ui"), model=ModelConfig(base_url=upstream.url, model="qwen3-8b")
            ),
            task_queue=worker.task_queue,
            workflow_id=workflow_id,
        )
    assert result.reward is not None and result.reward.total == 1.0
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = await browser.new_page(viewport={"width": 1600, "height": 1050})
            query = quote(f'WorkflowId="{workflow_id}"')
            await page.goto(f"{web_ui}/namespaces/default/workflows?query={query}")
            await page.get_by_role("link", name=workflow_id, exact=True).first.click(timeout=WAIT_MS)
            await page.get_by_role("tab", name="Event History").click(timeout=WAIT_MS)
            for summary in (
                "qwen3-8b call 1 (chat: 2 messages, 1 tools)",
                "qwen3-8b call 2 (chat: 4 messages, 1 tools)",
            ):
                await page.locator(f"text={summary} >> visible=true").first.wait_for(timeout=WAIT_MS)
            await page.locator(f"text=run {agent_python()} >> visible=true").first.wait_for(timeout=WAIT_MS)
            await page.get_by_role("button", name="Compact").click()  # one row per activity: its summary
            call = page.locator("text=qwen3-8b call 2 (chat: 4 messages, 1 tools) >> visible=true").first
            await call.wait_for(timeout=WAIT_MS)
            await call.scroll_into_view_if_needed()
            out = Path(os.environ.get("GYMFLOW_SCREENSHOTS") or tmp_path)
            out.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(out / "rollout-harness.png"))
        finally:
            await browser.close()
