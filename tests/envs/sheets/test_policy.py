"""The reference policy rebuilds the reference program from the prompt alone."""

from __future__ import annotations

from gymflow.envs.builtin.sheets.generate import spec
from gymflow.envs.builtin.sheets.policy import ReferencePolicy, reference_program
from gymflow.envs.contract import Message, Task, ToolSpec

TOOLS = [ToolSpec(name=n) for n in ("run_python", "read_range", "write_cells", "describe_workbook")]


def _opening(task: Task) -> list[Message]:
    return [Message(role="system", content="sys"), *task.opening_messages()]


def test_calls_run_python_with_the_reference_program(tasks: list[Task]) -> None:
    policy = ReferencePolicy()
    for task in tasks:
        messages = _opening(task)
        reply = policy.respond(messages, TOOLS)
        assert [c.name for c in reply.tool_calls] == ["run_python"]
        coords = task.init_args["generator"]
        assert reply.tool_calls[0].arguments == {"code": spec(coords["seed"], coords["index"]).program}
        assert policy.respond(messages, TOOLS) == reply  # pure: same conversation, same reply


def test_finishes_on_success_and_retries_a_failure_once(tasks: list[Task]) -> None:
    policy = ReferencePolicy()
    messages = _opening(tasks[0])
    first = policy.respond(messages, TOOLS)
    ok = [*messages, first, Message(role="tool", content="exit status 0 (512 ms)\n(no output)", tool_call_id="ref-0")]
    assert policy.respond(ok, TOOLS).tool_calls == []
    failed = [*messages, first, Message(role="tool", content="error: stopped: ...", tool_call_id="ref-0")]
    retry = policy.respond(failed, TOOLS)
    assert retry.tool_calls[0].id == "ref-1"
    failed_twice = [*failed, retry, Message(role="tool", content="error: again", tool_call_id="ref-1")]
    assert "giving up" in policy.respond(failed_twice, TOOLS).content


def test_unknown_tasks_get_no_tool_call(tasks: list[Task]) -> None:
    policy = ReferencePolicy()
    for prompt in ("Task id: 59196:1\nInstruction: ...", "no id at all", "Task id: g1-s0-00001:2"):
        reply = policy.respond([Message(role="user", content=prompt)], TOOLS)
        assert reply.tool_calls == [] and "no reference solution" in reply.content
    assert reference_program("g999-s0-00001:1") is None
    reply = policy.respond(_opening(tasks[0]), [ToolSpec(name="read_range")])
    assert reply.tool_calls == []
