"""Math tasks: a seeded procedural generator and a JSONL loader.

Design decisions:

* Generated problems are integer expression trees with exactly `difficulty` operations. Every
  division divides evenly (one side of a division is a leaf chosen to make it exact), so every
  intermediate value and the answer are integers: the ground truth is exact, and a policy that
  computes step by step with the calculator gets it exactly.
* All randomness comes from one `random.Random` seeded per task from (seed, index), so the same
  seed gives identical tasks and task i does not depend on how many tasks were asked for.
* The prompt carries the expression on one line after a fixed lead-in (`PROMPT_PREFIX`), so the
  baseline policy (and people reading trajectories) can find it without the metadata.
* The loader is strict: every problem raises `DatasetError` naming "path:LINE" and the field.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gymflow.envs.contract import Task
from gymflow.envs.errors import DatasetError

PROMPT_PREFIX = "Compute the value of the expression: "
"""The lead-in of a generated prompt; the expression follows it up to the end of the line."""
PROMPT_SUFFIX = (
    "Use the calculator tools for every arithmetic step, then give the final result as <answer>VALUE</answer>."
)
"""The second line of a generated prompt."""

_MAX_LEAF = 20
_MAX_ABS_VALUE = 10**6
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclass(frozen=True)
class _Node:
    """An expression tree node: a leaf (op is None) or a binary operation."""

    value: int
    op: str | None = None
    left: _Node | None = None
    right: _Node | None = None

    def render(self) -> str:
        if self.op is None or self.left is None or self.right is None:
            return str(self.value)
        prec = _PRECEDENCE[self.op]
        left = self.left.render()
        if self.left.op is not None and _PRECEDENCE[self.left.op] < prec:
            left = f"({left})"
        right = self.right.render()
        # The right operand needs parentheses at equal precedence too: a - (b - c), a / (b * c).
        if self.right.op is not None and (
            _PRECEDENCE[self.right.op] < prec or (_PRECEDENCE[self.right.op] == prec and self.op in "-/")
        ):
            right = f"({right})"
        return f"{left} {self.op} {right}"


def _leaf(rng: random.Random) -> _Node:
    return _Node(rng.randint(1, _MAX_LEAF))


def _tree(rng: random.Random, ops: int) -> _Node:
    """A random tree with exactly `ops` operations whose divisions are all exact."""
    if ops == 0:
        return _leaf(rng)
    left_ops = rng.randint(0, ops - 1)
    op = rng.choice("+-*/")
    if op != "/":
        left, right = _tree(rng, left_ops), _tree(rng, ops - 1 - left_ops)
        value = {"+": left.value + right.value, "-": left.value - right.value, "*": left.value * right.value}[op]
        return _Node(value, op, left, right)
    if left_ops == 0:
        # Leaf dividend: a multiple of the divisor subtree's value (positive, so no unary minus).
        right = _tree(rng, ops - 1)
        if right.value == 0:
            return _Node(0, "*", _leaf(rng), right)
        quotient = rng.randint(1, 9) * (1 if right.value > 0 else -1)
        return _Node(quotient, "/", _Node(quotient * right.value), right)
    # Subtree dividend, leaf divisor: pick a small divisor of the dividend's value.
    left = _tree(rng, ops - 1)
    divisors = [d for d in range(2, 13) if left.value % d == 0] or [1]
    divisor = rng.choice(divisors)
    return _Node(left.value // divisor, "/", left, _Node(divisor))


def generate_tasks(n: int, *, seed: int = 0, difficulty: int | Sequence[int] = 2, prefix: str = "math") -> list[Task]:
    """Generate `n` arithmetic problems, reproducibly.

    Args:
        n: Number of tasks.
        seed: Same seed, same tasks (ids, prompts and answers).
        difficulty: Number of binary operations in each expression (>= 1); a sequence is
            cycled through, task i getting ``difficulty[i % len(difficulty)]``.
        prefix: Task id prefix; ids are ``f"{prefix}-{seed}-{i}"``.

    Returns:
        Tasks whose prompt is ``PROMPT_PREFIX + expression + "\\n" + PROMPT_SUFFIX``, whose
        ground truth is the exact integer value as a string, and whose metadata holds
        ``difficulty`` and ``expression``.

    Raises:
        ValueError: `n` is negative or `difficulty` is below 1.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    if not levels or min(levels) < 1:
        raise ValueError(f"difficulty must be >= 1, got {difficulty}")
    tasks = []
    for i in range(n):
        level = levels[i % len(levels)]
        rng = random.Random(f"{seed}:{i}:{level}")
        tree = _tree(rng, level)
        while abs(tree.value) > _MAX_ABS_VALUE:  # rare with small leaves; keep numbers readable
            tree = _tree(rng, level)
        expression = tree.render()
        tasks.append(
            Task(
                id=f"{prefix}-{seed}-{i}",
                prompt=f"{PROMPT_PREFIX}{expression}\n{PROMPT_SUFFIX}",
                ground_truth=str(tree.value),
                metadata={"difficulty": level, "expression": expression, "source": "generated"},
            )
        )
    return tasks


def _answer_text(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DatasetError(f"{where}: field 'answer' must be a string or a number, got {type(value).__name__}")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str) and not value.strip():
        raise DatasetError(f"{where}: field 'answer' is empty")
    return str(value).strip()


def _row_to_task(row: dict[str, Any], default_id: str, where: str) -> Task:
    if "ground_truth" in row or "init_args" in row or isinstance(row.get("prompt"), list):  # a full Task
        try:
            task = Task.model_validate({"id": default_id, **row})
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "(row)"
            raise DatasetError(f"{where}: field {field!r}: {err['msg']}") from exc
        if task.ground_truth is None:
            raise DatasetError(f"{where}: missing field 'ground_truth'")
        return task
    unknown = set(row) - {"id", "question", "prompt", "answer", "metadata"}
    if unknown:
        raise DatasetError(f"{where}: unknown field(s) {sorted(unknown)}")
    if "question" in row and "prompt" in row:
        raise DatasetError(f"{where}: give either 'question' or 'prompt', not both")
    key = "question" if "question" in row else "prompt"
    question = row.get(key)
    if question is None:
        raise DatasetError(f"{where}: missing field 'question' (or 'prompt')")
    if not isinstance(question, str) or not question.strip():
        raise DatasetError(f"{where}: field {key!r} must be a non-empty string")
    if "answer" not in row:
        raise DatasetError(f"{where}: missing field 'answer'")
    task_id = row.get("id", default_id)
    if not isinstance(task_id, str | int) or isinstance(task_id, bool) or not str(task_id).strip():
        raise DatasetError(f"{where}: field 'id' must be a non-empty string")
    metadata = row.get("metadata", {})
    if not isinstance(metadata, dict):
        raise DatasetError(f"{where}: field 'metadata' must be an object")
    return Task(id=str(task_id), prompt=question, ground_truth=_answer_text(row["answer"], where), metadata=metadata)


def load_jsonl(path: str | Path) -> list[Task]:
    """Load math tasks from a JSONL file.

    Each non-blank line is a JSON object: either a full `Task` (it has ``ground_truth``), or
    ``{"id"?, "question" | "prompt", "answer", "metadata"?}`` where ``id`` defaults to
    ``f"{file stem}-{line number}"`` and a numeric answer is stored as an exact string.

    Args:
        path: The JSONL file.

    Returns:
        The tasks, in file order.

    Raises:
        DatasetError: The file is unreadable or has no rows, or a line is not valid JSON, not an
            object, misses a field, has a field of the wrong type, or repeats an id; the message
            starts with "path:LINE:".
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read: {exc}") from exc
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
        except (ValueError, RecursionError) as exc:  # a number over Python's digit limit; absurd nesting
            raise DatasetError(f"{where}: unreadable JSON: {str(exc)[:200]}") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
        task = _row_to_task(row, f"{path.stem}-{number}", where)
        if task.id in seen:
            raise DatasetError(f"{where}: field 'id': duplicate id {task.id!r} (first on line {seen[task.id]})")
        seen[task.id] = number
        tasks.append(task)
    if not tasks:
        raise DatasetError(f"{path}:1: the file has no rows")
    return tasks
