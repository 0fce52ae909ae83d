"""A learnable math policy: the calculator policy's plan, with its choices sampled from parameters.

The reference trainer (gymflow.workers.trainers.reference) trains this policy with GRPO on the math env.
It reads the expression and plans its binary operations exactly as `CalculatorPolicy` does, but
every choice the calculator policy gets right by construction is a sample from a softmax over
features of the observation:

* each turn, while the result is unknown: call the calculator for the operations whose operands
  are known, or answer now (with the last value it got, or "unknown");
* for each operation, which calculator tool to call (add, subtract, multiply, divide, power),
  given the operator the expression shows (a 5 x 5 table of logits);
* for each operation with two different operands, whether to swap them (a logit per operator).

At zero parameters (`SoftmaxParams.zeros()`, also the env's `softmax` baseline policy) it picks
uniformly and rarely solves a task; learning shows only through rewards. It never reads an answer:
the ground truth is not in the conversation, and every value comes from a tool message.

`decisions(messages)` recovers the choices an assistant message made from the conversation (the
tool names, the argument order, answer or call), so a trainer can compute log-probabilities and
their gradients under any parameters from a trajectory alone. Parameters are plain JSON (never
pickled).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gymflow.envs.builtin.math.policy import (
    MAX_ATTEMPTS,
    Progress,
    answer_message,
    format_value,
    parse_expression,
    plan,
)
from gymflow.envs.contract import Message, ToolCall, ToolSpec
from gymflow.envs.policy import Policy

TOOLS = ("add", "subtract", "multiply", "divide", "power")
"""The calculator's binary tools: the tool choices, and the operators (by their right tool)."""
ARGUMENTS = {"power": ("base", "exponent")}
FORMAT = "gymflow-softmax-policy/1"
TURN_FEATURES = 3


@dataclass
class Decision:
    """One sampled choice: `kind` turn (1 = call, 0 = answer), tool (index into TOOLS) or swap (1 = swapped)."""

    kind: str
    choice: int
    op: int = 0
    features: tuple[float, ...] = ()


@dataclass
class SoftmaxParams:
    turn: np.ndarray
    """Logit of calling (vs answering) = turn . [1, fraction of steps done, any tool error]."""
    tool: np.ndarray
    """tool[op, t]: logit of tool t for an operation whose operator's tool is op."""
    swap: np.ndarray
    """swap[op]: logit of swapping the operands."""

    @classmethod
    def zeros(cls) -> SoftmaxParams:
        return cls(np.zeros(TURN_FEATURES), np.zeros((len(TOOLS), len(TOOLS))), np.zeros(len(TOOLS)))

    def copy(self) -> SoftmaxParams:
        return SoftmaxParams(self.turn.copy(), self.tool.copy(), self.swap.copy())

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "tools": list(TOOLS), "turn": self.turn.tolist(), "tool": self.tool.tolist(),
                "swap": self.swap.tolist()}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SoftmaxParams:
        """Parameters from `to_json` output.

        Raises:
            ValueError: Not this policy's parameters, or the wrong shapes.
        """
        if data.get("format") != FORMAT or list(data.get("tools", [])) != list(TOOLS):
            raise ValueError(f"not {FORMAT} parameters")
        params = cls(np.asarray(data["turn"], float), np.asarray(data["tool"], float), np.asarray(data["swap"], float))
        zeros = cls.zeros()
        if any(a.shape != b.shape for a, b in zip(params.arrays(), zeros.arrays(), strict=True)):
            raise ValueError("parameter shapes do not match the policy")
        return params

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.turn, self.tool, self.swap

    # -- probabilities -------------------------------------------------------------------------
    def probabilities(self, decision: Decision) -> np.ndarray:
        """The distribution `decision` was drawn from (over its choices)."""
        if decision.kind == "turn":
            p = _sigmoid(float(self.turn @ np.asarray(decision.features)))
            return np.array([1.0 - p, p])
        if decision.kind == "swap":
            p = _sigmoid(float(self.swap[decision.op]))
            return np.array([1.0 - p, p])
        logits = self.tool[decision.op]
        z = np.exp(logits - logits.max())
        return np.asarray(z / z.sum())

    def logprob(self, decision: Decision) -> float:
        return float(math.log(max(self.probabilities(decision)[decision.choice], 1e-300)))

    def grad(self, decisions: Sequence[Decision]) -> SoftmaxParams:
        """The gradient of the summed log-probability of `decisions`."""
        g = SoftmaxParams.zeros()
        for d in decisions:
            probs = self.probabilities(d)
            if d.kind == "turn":
                g.turn += (d.choice - probs[1]) * np.asarray(d.features)
            elif d.kind == "swap":
                g.swap[d.op] += d.choice - probs[1]
            else:
                g.tool[d.op] += np.eye(len(TOOLS))[d.choice] - probs
        return g

    def step(self, grad: SoftmaxParams, lr: float) -> None:
        self.turn += lr * grad.turn
        self.tool += lr * grad.tool
        self.swap += lr * grad.swap


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, x))))


@dataclass
class _Situation:
    """What a turn sees: the plan, the progress, and whether a choice is to be made."""

    steps: list[Any]
    progress: Progress
    ready: list[int]
    features: tuple[float, ...]


def _situation(messages: Sequence[Message]) -> tuple[_Situation | None, Message | None]:
    """(the situation of a turn with choices, None) or (None, the forced reply)."""
    first_user = next((m for m in messages if m.role == "user"), None)
    expression = parse_expression(first_user.content) if first_user else None
    planned = plan(expression) if expression else None
    if planned is None:
        return None, answer_message("unknown")
    steps, root = planned
    progress = Progress(steps, messages)
    final = progress.resolve(root)
    if final is not None:
        return None, answer_message(format_value(final))
    if any(n >= MAX_ATTEMPTS and k not in progress.values for k, n in progress.errors.items()):
        return None, _give_up(progress)
    ready = [i for i in range(len(steps)) if i not in progress.values and progress.arguments(i) is not None]
    if not ready:
        return None, _give_up(progress)
    features = (1.0, len(progress.values) / len(steps), float(bool(progress.errors)))
    return _Situation(steps, progress, ready, features), None


def _give_up(progress: Progress) -> Message:
    return answer_message("unknown" if progress.last is None else format_value(progress.last))


def _operands(situation: _Situation, step: int) -> tuple[Any, ...]:
    return tuple(situation.progress.resolve(o) for o in situation.steps[step].operands)


class SoftmaxPolicy(Policy):
    """The calculator policy's plan with sampled choices (see the module docstring)."""

    name = "softmax"

    def __init__(self, params: SoftmaxParams | None = None, *, seed: int | None = None) -> None:
        self.params = params or SoftmaxParams.zeros()
        self._rng = np.random.default_rng(seed)

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        return self.act(messages, tools)[0]

    def act(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], rng: np.random.Generator | None = None
    ) -> tuple[Message, list[Decision]]:
        """The next message and the choices sampled for it."""
        rng = rng or self._rng
        situation, forced = _situation(messages)
        if situation is None:
            return forced or answer_message("unknown"), []
        p = self.params
        turn = Decision("turn", 0, features=situation.features)
        turn.choice = int(rng.random() < p.probabilities(turn)[1])
        if not turn.choice:
            return _give_up(situation.progress), [turn]
        offered = {t.name for t in tools}
        decisions, calls = [turn], []
        for step in situation.ready:
            spec = situation.steps[step]
            values = _operands(situation, step)
            attempt = situation.progress.errors.get(step, 0)
            call_id = f"calc-{step}-{attempt}"
            if spec.tool not in TOOLS:  # sqrt: one operand, one tool, nothing to choose
                calls.append(ToolCall(id=call_id, name=spec.tool, arguments={"x": values[0]}))
                continue
            op = TOOLS.index(spec.tool)
            probs = p.probabilities(Decision("tool", 0, op)) * np.array([t in offered for t in TOOLS], float)
            if probs.sum() == 0:
                return answer_message("unknown"), decisions
            tool = int(rng.choice(len(TOOLS), p=probs / probs.sum()))
            decisions.append(Decision("tool", tool, op))
            if values[0] != values[1]:
                swap = Decision("swap", 0, op)
                swap.choice = int(rng.random() < p.probabilities(swap)[1])
                decisions.append(swap)
                if swap.choice:
                    values = values[::-1]
            names = ARGUMENTS.get(TOOLS[tool], ("a", "b"))
            calls.append(ToolCall(id=call_id, name=TOOLS[tool], arguments=dict(zip(names, values, strict=True))))
        return Message(role="assistant", tool_calls=calls), decisions


def decisions(messages: Sequence[Message]) -> list[Decision]:
    """The choices every assistant message of a conversation made (the trainer's view of a rollout)."""
    out: list[Decision] = []
    for index, message in enumerate(messages):
        if message.role != "assistant":
            continue
        situation, _ = _situation(messages[:index])
        if situation is None:
            continue
        if not message.tool_calls:
            out.append(Decision("turn", 0, features=situation.features))
            continue
        out.append(Decision("turn", 1, features=situation.features))
        for call in message.tool_calls:
            step = _step_of(call)
            if step is None or step >= len(situation.steps) or situation.steps[step].tool not in TOOLS:
                continue
            op = TOOLS.index(situation.steps[step].tool)
            if call.name not in TOOLS:
                continue
            out.append(Decision("tool", TOOLS.index(call.name), op))
            values = _operands(situation, step)
            if values[0] != values[1]:
                given = tuple(call.arguments.values())
                out.append(Decision("swap", int(given == values[::-1]), op))
    return out


def _step_of(call: ToolCall) -> int | None:
    parts = call.id.split("-")
    return int(parts[1]) if len(parts) == 3 and parts[0] == "calc" and parts[1].isdigit() else None
