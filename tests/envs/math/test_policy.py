"""The calculator baseline policy, played against the real calculator server in memory."""

from mcp import Client

from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy, Ref, Step, parse_expression, plan, play, play_tasks
from gymflow.envs.builtin.math.rewards import answer_reward
from gymflow.envs.contract import Message, Task, ToolCall, ToolSpec
from gymflow.envs.policy import NullPolicy

TOOLS = [ToolSpec(name=n) for n in ("add", "subtract", "multiply", "divide", "power", "sqrt")]


def _tasks() -> list[Task]:
    return [t for d in (1, 2, 3, 4) for t in generate_tasks(50, seed=11, difficulty=d, prefix=f"d{d}")]


async def test_solves_200_generated_tasks_with_the_calculator(calculator: Client) -> None:
    policy = CalculatorPolicy()
    tasks = _tasks()
    assert len(tasks) == 200
    for task in tasks:
        messages = await play(policy, task, calculator)
        calls = [c for m in messages if m.role == "assistant" for c in m.tool_calls]
        assert len(calls) == task.metadata["difficulty"], task.metadata["expression"]
        assert all(m.role != "tool" or not m.is_error for m in messages)
        assert messages[-1].role == "assistant"
        assert not messages[-1].tool_calls
        assert messages[-1].content == f"<answer>{task.ground_truth}</answer>"
        assert answer_reward(messages, task.ground_truth).total == 1.0


async def test_play_tasks_scores_the_baseline_1_and_the_null_policy_0() -> None:
    tasks = _tasks()
    assert [r.total for r in await play_tasks(CalculatorPolicy(), tasks)] == [1.0] * 200
    null = await play_tasks(NullPolicy(), tasks)
    assert [r.total for r in null] == [0.0] * 200
    assert all(r.components["format"] == 0.0 for r in null)


def test_plan_is_post_order() -> None:
    assert plan("(1 + 2) * (3 - 4)") == (
        [Step("add", (1, 2)), Step("subtract", (3, 4)), Step("multiply", (Ref(0), Ref(1)))],
        Ref(2),
    )
    assert plan("-(2 ** 3) + sqrt(-4 / -1)") == (
        [
            Step("power", (2, 3)),
            Step("subtract", (0, Ref(0))),
            Step("divide", (-4, -1)),
            Step("sqrt", (Ref(2),)),
            Step("add", (Ref(1), Ref(3))),
        ],
        Ref(4),
    )
    assert plan("7") == ([], 7)
    for bad in ("x + 1", "1 +", "abs(1)", "1 // 2", "'a'"):
        assert plan(bad) is None
    assert parse_expression("Please.\nCompute the value of the expression: 1 + 2\nThanks") == "1 + 2"
    assert parse_expression("What is 1 + 2?") is None


def _user(expression: str) -> Message:
    return Message(role="user", content=f"Compute the value of the expression: {expression}\nUse the tools.")


def _tool(call_id: str | None, content: str, *, error: bool = False) -> Message:
    return Message(role="tool", content=content, tool_call_id=call_id, is_error=error)


def test_parallel_calls_and_uses_tool_values_not_its_own_arithmetic() -> None:
    policy = CalculatorPolicy()
    messages = [_user("(1 + 2) * (3 + 4)")]
    first = policy.respond(messages, TOOLS)
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]
    assert policy.respond(messages, TOOLS) == first  # stateless: same conversation, same reply
    # Deliberately wrong tool results: the policy must carry them, not recompute.
    messages += [first, _tool(first.tool_calls[1].id, "10"), _tool(first.tool_calls[0].id, "100")]
    second = policy.respond(messages, TOOLS)
    assert [(c.name, c.arguments) for c in second.tool_calls] == [("multiply", {"a": 100, "b": 10})]
    messages += [second, _tool(second.tool_calls[0].id, "1000")]
    assert policy.respond(messages, TOOLS) == Message(role="assistant", content="<answer>1000</answer>")


def test_matches_rewritten_ids_and_unlabelled_tool_messages() -> None:
    policy = CalculatorPolicy()
    messages = [_user("(1 + 2) * 3")]
    first = policy.respond(messages, TOOLS)
    renamed = ToolCall(id="srv-1", name=first.tool_calls[0].name, arguments=first.tool_calls[0].arguments)
    messages += [Message(role="assistant", tool_calls=[renamed]), _tool(None, "3")]
    second = policy.respond(messages, TOOLS)
    assert [(c.name, c.arguments) for c in second.tool_calls] == [("multiply", {"a": 3, "b": 3})]
    messages += [second, _tool("unknown-id", '{"result": 9}')]
    assert policy.respond(messages, TOOLS).content == "<answer>9</answer>"


def test_retries_a_failed_step_once_then_answers_with_what_it_has() -> None:
    policy = CalculatorPolicy()
    messages = [_user("(6 - 2) / (5 - 5)")]
    first = policy.respond(messages, TOOLS)
    messages += [first, _tool(first.tool_calls[0].id, "4"), _tool(first.tool_calls[1].id, "0")]
    divide = policy.respond(messages, TOOLS)
    messages += [divide, _tool(divide.tool_calls[0].id, "Error: division by zero", error=True)]
    retry = policy.respond(messages, TOOLS)
    assert [(c.name, c.arguments) for c in retry.tool_calls] == [("divide", {"a": 4, "b": 0})]
    assert retry.tool_calls[0].id != divide.tool_calls[0].id
    messages += [retry, _tool(retry.tool_calls[0].id, "Error: division by zero", error=True)]
    final = policy.respond(messages, TOOLS)
    assert not final.tool_calls
    assert final.content == "<answer>0</answer>"


def test_a_retry_that_succeeds_finishes_the_task() -> None:
    policy = CalculatorPolicy()
    messages = [_user("2 * 3")]
    first = policy.respond(messages, TOOLS)
    messages += [first, _tool(first.tool_calls[0].id, "server hiccup", error=True)]
    retry = policy.respond(messages, TOOLS)
    messages += [retry, _tool(retry.tool_calls[0].id, "not a number")]  # unreadable counts as a failure
    assert policy.respond(messages, TOOLS).content == "<answer>unknown</answer>"


def test_unparseable_prompt_or_missing_tool_answers_unknown() -> None:
    policy = CalculatorPolicy()
    for prompt in ("What is the capital of France?", "Compute the value of the expression: x + 1"):
        reply = policy.respond([Message(role="user", content=prompt)], TOOLS)
        assert reply == Message(role="assistant", content="<answer>unknown</answer>")
    reply = policy.respond([_user("2 * 3")], [ToolSpec(name="add")])
    assert reply == Message(role="assistant", content="<answer>unknown</answer>")
    assert policy.respond([], TOOLS).content == "<answer>unknown</answer>"
