"""Fuzzed model output through the real `generate` activity and a real HTTP endpoint serving it.

Whatever the endpoint answers — broken JSON, wrong types, unknown tools, nested garbage, huge
strings — the activity returns an assistant message (malformed calls kept with `parse_error`,
which the workflow turns into an error observation) or raises a typed ApplicationError that
Temporal retries or not. Nothing else: no other exception, no hang.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from fuzzing import SIZES, Driver, Tally, fuzz_settings, hostile_text, huge_strings, hypothesis_in_thread, json_values
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from gymflow.activities.errors import CONTEXT_LENGTH, MODEL_ERROR, MODEL_REJECTED
from gymflow.activities.model import GenerateInput, ModelActivities, ModelConfig
from gymflow.activities.schema import RetrySettings, RolloutInput, RolloutLimits
from gymflow.envs.contract import Message, Task, TerminationReason, ToolSpec
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.servers.policy import AppServer
from gymflow.workers.worker import RunningWorker

TOOLS = [
    ToolSpec(name="add", input_schema={"type": "object", "properties": {"a": {}, "b": {}}}),
    ToolSpec(name="sqrt", input_schema={"type": "object", "properties": {"x": {}}}),
]
MESSAGES = [Message(role="system", content="s"), Message(role="user", content="2+3?")]


class Replies:
    """Serves, at `/<case>/v1/chat/completions`, the exact bytes registered for that case."""

    def __init__(self) -> None:
        self.bodies: dict[str, tuple[int, bytes]] = {}
        self.app = Starlette(routes=[Route("/{case}/v1/chat/completions", self.handle, methods=["POST"])])

    async def handle(self, request: Request) -> Response:
        await request.body()
        status, body = self.bodies.get(request.path_params["case"], (404, b"unknown case"))
        return Response(body, status_code=status, media_type="application/json")


NAMES = st.sampled_from(["add", "sqrt", "rm_rf", "", "ADD"])
OBJECTS = st.dictionaries(st.sampled_from(["a", "b", "x", "extra"]), json_values(3), max_size=3)


def arguments() -> st.SearchStrategy[Any]:
    """A native call's `arguments`: usually a string (valid, broken, double-encoded), sometimes not."""
    return st.one_of(
        OBJECTS.map(json.dumps),
        OBJECTS.map(lambda v: json.dumps(json.dumps(v))),
        json_values().map(json.dumps),
        hostile_text(),
        json_values(),
    )


def native_call() -> st.SearchStrategy[Any]:
    plausible = st.fixed_dictionaries(
        {"id": st.text(max_size=8), "type": st.just("function"), "function": st.fixed_dictionaries(
            {"name": NAMES, "arguments": OBJECTS.map(json.dumps)})}
    )  # fmt: skip
    function = st.fixed_dictionaries(
        {}, optional={"name": NAMES | st.text(max_size=30) | json_values(3), "arguments": arguments()}
    )
    call = st.fixed_dictionaries(
        {}, optional={"id": st.text(max_size=10) | json_values(2), "type": st.just("function"), "function": function}
    )
    return st.one_of(plausible, call, json_values(5))


def hermes_content() -> st.SearchStrategy[str]:
    block = st.one_of(
        st.builds(lambda n, a: json.dumps({"name": n, "arguments": a}), NAMES, OBJECTS),
        st.builds(lambda n, a: json.dumps({"name": n, "arguments": a}), NAMES | json_values(2), json_values()),
        hostile_text(),
    )
    parts = st.lists(st.one_of(block.map(lambda b: f"<tool_call>{b}</tool_call>"), st.text(max_size=40)), max_size=4)
    return st.builds(lambda ps, tail: "".join(ps) + tail, parts, st.sampled_from(["", "<tool_call>{", "</tool_call>"]))


def message() -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["assistant", "user", "tool"]) | json_values(2),
            "content": hermes_content() | st.none() | huge_strings() | json_values(4),
            "tool_calls": st.lists(native_call(), min_size=1, max_size=4) | st.none() | json_values(3),
        },
    )


def completion() -> st.SearchStrategy[Any]:
    choice = st.fixed_dictionaries(
        {"message": message()},
        optional={"finish_reason": st.sampled_from(["stop", "tool_calls", "length"]) | json_values(2)},
    )
    choices = st.lists(choice, min_size=1, max_size=2)
    return st.fixed_dictionaries(
        {"choices": choices},  # a valid envelope (broken ones come from the "json" kind)
        optional={"usage": json_values(6), "model": json_values(2)},
    )


def reply(kind: str) -> st.SearchStrategy[tuple[int, bytes]]:
    """(status, body) of the endpoint's answer: a completion envelope with hostile contents, any
    JSON, or hostile text."""
    body = {
        "completion": completion().map(json.dumps),
        "json": json_values().map(json.dumps),
        "text": hostile_text(),
    }[kind].map(lambda text: text.encode("utf-8", errors="surrogatepass"))
    status = st.sampled_from([200] * 16 + [400, 404, 429, 500, 503])
    return st.tuples(status, body)


async def generate(
    model: ModelActivities, replies: Replies, url: str, *, case: tuple[int, bytes], fmt: str, tally: Tally
) -> None:
    key = uuid.uuid4().hex
    replies.bodies[key] = case
    input = GenerateInput(
        model=ModelConfig(base_url=f"{url}/{key}/v1", tool_format=fmt, request_timeout_s=30),  # type: ignore[arg-type]
        messages=MESSAGES,
        tools=TOOLS,
        rollout_id="fuzz",
        turn=1,
    )
    try:
        result = await ActivityEnvironment().run(model.generate, input)
    except ApplicationError as exc:
        assert exc.type in {MODEL_ERROR, MODEL_REJECTED, CONTEXT_LENGTH}, exc
        tally.case(f"error:{exc.type}")
        return
    assert result.message.role == "assistant" and isinstance(result.message.content, str)
    for call in result.message.tool_calls:
        assert isinstance(call.name, str) and isinstance(call.arguments, dict)
        assert call.parse_error is None or call.arguments == {}
    bad = sum(c.parse_error is not None for c in result.message.tool_calls)
    unknown = sum(c.parse_error is None and c.name not in {"add", "sqrt"} for c in result.message.tool_calls)
    tally.case("message")
    tally["calls_parsed"] += len(result.message.tool_calls) - bad
    tally["calls_malformed"] += bad
    tally["calls_unknown_tool"] += unknown


@pytest.mark.parametrize("examples", SIZES)
async def test_fuzzed_model_output_becomes_a_message_or_a_typed_error(examples: int) -> None:
    tally = Tally()
    replies = Replies()
    model = ModelActivities(default_base_url=None)
    async with AppServer(replies.app) as server:
        url = f"http://127.0.0.1:{server.port}"

        @fuzz_settings(examples)
        @given(
            kind=st.sampled_from(["completion"] * 3 + ["json", "text"]),
            fmt=st.sampled_from(["native", "hermes"]),
            data=st.data(),
        )
        def check(driver: Driver, kind: str, fmt: str, data: st.DataObject) -> None:
            driver.run(generate(model, replies, url, case=data.draw(reply(kind)), fmt=fmt, tally=tally))

        try:
            await hypothesis_in_thread(check)
        finally:
            await model.aclose()
    assert tally["message"] > 0 and tally.cases > tally["message"]
    tally.record("fuzz", f"model output -> generate activity ({examples} examples)")


async def rollout(
    client: Client, queue: str, url: str, replies: Replies, *, case: tuple[int, bytes], fmt: str, tally: Tally
) -> None:
    """A whole rollout whose model answers `case` every turn: it must end, never get stuck."""
    key = uuid.uuid4().hex
    replies.bodies[key] = case
    handle = await start_rollout(
        client,
        RolloutInput(
            env="math-inproc",
            task=Task(id="fuzz", prompt="2+3?", ground_truth="5"),
            model=ModelConfig(base_url=f"{url}/{key}/v1", tool_format=fmt, request_timeout_s=10),  # type: ignore[arg-type]
            limits=RolloutLimits(max_turns=3, tool_timeout_s=10),
            retry=RetrySettings(model_attempts=1),
        ),
        task_queue=queue,
    )
    result = await asyncio.wait_for(handle.result(), timeout=60)
    del replies.bodies[key]
    events = (await handle.fetch_history()).events
    assert not any(e.HasField("workflow_task_failed_event_attributes") for e in events)
    assert result.termination in {TerminationReason.FINAL_ANSWER, TerminationReason.MAX_TURNS,
                                  TerminationReason.MODEL_ERROR}, result  # fmt: skip
    tally.case(result.termination.value)
    observations = [m for m in result.messages if m.role == "tool"]
    tally["error_observations"] += sum(m.is_error for m in observations)
    tally["tool_results"] += sum(not m.is_error for m in observations)


@pytest.mark.parametrize(
    "examples", [pytest.param(15, id="quick"), pytest.param(150, id="big", marks=pytest.mark.slow)]
)
async def test_fuzzed_model_output_never_sticks_a_rollout(client: Client, worker: RunningWorker, examples: int) -> None:
    tally = Tally()
    replies = Replies()
    async with AppServer(replies.app) as server:
        url = f"http://127.0.0.1:{server.port}"

        @fuzz_settings(examples)
        @given(
            kind=st.sampled_from(["completion"] * 3 + ["json", "text"]),
            fmt=st.sampled_from(["native", "hermes"]),
            data=st.data(),
        )
        def check(driver: Driver, kind: str, fmt: str, data: st.DataObject) -> None:
            case = data.draw(reply(kind))
            driver.run(rollout(client, worker.task_queue, url, replies, case=case, fmt=fmt, tally=tally))

        await hypothesis_in_thread(check)
    tally.record("fuzz", f"model output -> whole rollouts ({examples} examples)")
