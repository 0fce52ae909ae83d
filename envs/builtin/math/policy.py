"""The math env's baseline policy: solve the expression step by step with the calculator.

`CalculatorPolicy` reads the expression from the first user message (the line a generated task
writes after `PROMPT_PREFIX`), plans it as binary operations in post-order, and asks the
calculator for every operation whose operands are known, all in one assistant message (parallel
tool calls). It never computes a result itself: every value it uses comes from a tool message.

Design decisions:

* Stateless. Each call replays the conversation: tool call ids (``calc-STEP-ATTEMPT``) say which
  step a call was, and tool messages are matched by ``tool_call_id`` or, failing that, by order.
  Calls with foreign ids are matched by tool name and arguments, so the policy still works behind
  a server that rewrites ids.
* Errors are data: a failed step is retried once, then the policy answers with the last value it
  got (or ``unknown``). A prompt it cannot parse, or a missing tool, gets ``<answer>unknown</answer>``.
* `play` and `play_tasks` drive the policy against the real calculator in memory; they are the
  check that the baseline solves every generated task (tests call them).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from mcp import Client

from gymflow.envs.builtin.math.data import PROMPT_PREFIX
from gymflow.envs.builtin.math.rewards import answer_reward
from gymflow.envs.contract import Message, Reward, Task, ToolCall, ToolSpec
from gymflow.envs.policy import Policy, converse

Value = int | float

_EXPRESSION_RE = re.compile(re.escape(PROMPT_PREFIX.strip()) + r"[ \t]*([^\n]+)")
_CALL_ID_RE = re.compile(r"calc-(\d+)-(\d+)")
_BINARY_TOOLS = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply", ast.Div: "divide", ast.Pow: "power"}
_ARGUMENT_NAMES = {"power": ("base", "exponent"), "sqrt": ("x",)}
MAX_ATTEMPTS = 2
"""Failed calls of one step after which a scripted player gives up on the task and answers what it has."""


@dataclass(frozen=True)
class Ref:
    """An operand that is the result of an earlier step."""

    step: int


Operand = Value | Ref


@dataclass(frozen=True)
class Step:
    """One calculator call of a plan."""

    tool: str
    operands: tuple[Operand, ...]


def parse_expression(text: str) -> str | None:
    """The expression a generated prompt asks for, or None if `text` has none."""
    match = _EXPRESSION_RE.search(text)
    return match.group(1).strip() if match else None


def plan(expression: str) -> tuple[list[Step], Operand] | None:
    """Decompose an expression into calculator steps in post-order.

    Args:
        expression: Numbers with ``+ - * / **``, parentheses, unary minus and ``sqrt()``.

    Returns:
        The steps and the operand holding the final value (a literal when there is no step), or
        None when the expression is not plain arithmetic.
    """
    steps: list[Step] = []

    def visit(node: ast.AST) -> Operand:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            inner = visit(node.operand)
            if isinstance(node.op, ast.UAdd):
                return inner
            if not isinstance(inner, Ref):
                return -inner  # a signed literal, not arithmetic
            steps.append(Step("subtract", (0, inner)))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY_TOOLS:
            left, right = visit(node.left), visit(node.right)
            steps.append(Step(_BINARY_TOOLS[type(node.op)], (left, right)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sqrt":
            if len(node.args) != 1 or node.keywords:
                raise ValueError("sqrt takes one argument")
            steps.append(Step("sqrt", (visit(node.args[0]),)))
        else:
            raise ValueError(f"unsupported syntax: {ast.dump(node)}")
        return Ref(len(steps) - 1)

    try:
        root = visit(ast.parse(expression.replace("^", "**"), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        return None
    return steps, root


def _tool_value(content: str) -> Value | None:
    """The number a calculator tool message carries ("3", "2.5", or {"result": 3})."""
    try:
        value = json.loads(content)
    except ValueError:
        return None
    if isinstance(value, dict):
        value = value.get("result")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return value


def format_value(value: Value) -> str:
    """A value as the answer states it (an integral float without its `.0`)."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def answer_message(text: str) -> Message:
    """The final assistant message answering `text`."""
    return Message(role="assistant", content=f"<answer>{text}</answer>")


class Progress:
    """What the conversation so far says about a plan's steps."""

    def __init__(self, steps: Sequence[Step], messages: Sequence[Message]) -> None:
        self.steps = steps
        self.values: dict[int, Value] = {}
        self.errors: dict[int, int] = {}
        self.last: Value | None = None
        calls: dict[str, int] = {}
        pending: list[str] = []
        for message in messages:
            if message.role == "assistant":
                for call in message.tool_calls:
                    step = self._step_of(call, set(calls.values()))
                    if step is not None:
                        calls[call.id] = step
                        pending.append(call.id)
            elif message.role == "tool" and pending:
                call_id = message.tool_call_id if message.tool_call_id in pending else pending[0]
                pending.remove(call_id)
                self._record(calls[call_id], None if message.is_error else _tool_value(message.content))

    def _record(self, step: int, value: Value | None) -> None:
        if value is None:
            self.errors[step] = self.errors.get(step, 0) + 1
        else:
            self.values[step] = self.last = value

    def resolve(self, operand: Operand) -> Value | None:
        return self.values.get(operand.step) if isinstance(operand, Ref) else operand

    def arguments(self, step: int) -> dict[str, Value] | None:
        """The call arguments of `step`, or None while an operand is unknown."""
        spec = self.steps[step]
        values = [self.resolve(o) for o in spec.operands]
        if any(v is None for v in values):
            return None
        names = _ARGUMENT_NAMES.get(spec.tool, ("a", "b"))
        return {n: v for n, v in zip(names, values, strict=True) if v is not None}

    def _step_of(self, call: ToolCall, called: set[int]) -> int | None:
        match = _CALL_ID_RE.fullmatch(call.id)
        if match and int(match.group(1)) < len(self.steps):
            return int(match.group(1))
        # A rewritten id: the first open step this call's name and arguments fit.
        for step, spec in enumerate(self.steps):
            fits = spec.tool == call.name and self.arguments(step) == call.arguments
            if fits and step not in self.values and (step not in called or self.errors.get(step)):
                return step
        return None


class CalculatorPolicy(Policy):
    """Solves generated arithmetic tasks by calling the calculator for every operation."""

    name = "calculator"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        """The next assistant message: parallel calculator calls, or the final answer.

        Args:
            messages: The conversation so far; the expression is read from the first user message.
            tools: The tools offered; a step whose tool is missing ends the rollout with ``unknown``.

        Returns:
            An assistant message with tool calls, or ``<answer>VALUE</answer>`` without any.
        """
        first_user = next((m for m in messages if m.role == "user"), None)
        expression = parse_expression(first_user.content) if first_user else None
        planned = plan(expression) if expression else None
        if planned is None:
            return answer_message("unknown")
        steps, root = planned
        progress = Progress(steps, messages)
        final = progress.resolve(root)
        if final is not None:
            return answer_message(format_value(final))
        if any(n >= MAX_ATTEMPTS and k not in progress.values for k, n in progress.errors.items()):
            return answer_message("unknown" if progress.last is None else format_value(progress.last))
        available = {t.name for t in tools}
        calls = []
        for step, spec in enumerate(steps):
            arguments = progress.arguments(step)
            if step in progress.values or arguments is None:
                continue
            if spec.tool not in available:
                return answer_message("unknown")
            attempt = progress.errors.get(step, 0)
            calls.append(ToolCall(id=f"calc-{step}-{attempt}", name=spec.tool, arguments=dict(arguments)))
        if not calls:  # an answer went missing; nothing left to ask
            return answer_message("unknown" if progress.last is None else format_value(progress.last))
        return Message(role="assistant", tool_calls=calls)


async def play(
    policy: Policy, task: Task, client: Client, *, max_turns: int = 32, system: str | None = None
) -> list[Message]:
    """Run one rollout of `policy` on `task` against an MCP client's tools.

    Args:
        policy: The policy to play.
        task: The task; its opening messages start the conversation.
        client: A connected MCP client (e.g. ``Client(calculator.server)``).
        max_turns: Assistant turns before giving up.
        system: A system prompt to open the conversation with (none by default).

    Returns:
        The whole conversation, ending with the policy's last message.
    """
    listed = await client.list_tools()
    tools = [ToolSpec(name=t.name, description=t.description or "", input_schema=t.input_schema) for t in listed.tools]
    messages = [Message(role="system", content=system)] if system is not None else []
    messages += task.opening_messages()

    async def run(call: ToolCall) -> tuple[str, bool]:
        result = await client.call_tool(call.name, call.arguments)
        return "".join(getattr(block, "text", "") for block in result.content), bool(result.is_error)

    return await converse(policy, messages, tools, run, max_turns=max_turns)


async def play_tasks(policy: Policy, tasks: Sequence[Task], *, max_turns: int = 32) -> list[Reward]:
    """Play `policy` on every task against the in-memory calculator and score each rollout.

    Args:
        policy: The policy to play.
        tasks: Math tasks (e.g. from `gymflow.envs.builtin.math.data.generate_tasks`).
        max_turns: Assistant turns per rollout.

    Returns:
        One `answer_reward` per task, in order.
    """
    # Imported here, not at module top: building an MCPServer configures the process's root
    # logging, which a policy module (imported by workers and the CLI) must not do.
    from gymflow.envs.builtin.math.servers.calculator import server as calculator_server

    async with Client(calculator_server) as client:
        return [
            answer_reward(await play(policy, task, client, max_turns=max_turns), task.ground_truth) for task in tasks
        ]
