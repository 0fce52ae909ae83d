"""The shape of a CRM task (question, ground truth, reference tool calls) and helpers the families share."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gymflow.envs.builtin.crm.db import CrmData

REFUSAL = "REFUSE"
"""The whole answer to a request for personal data."""


Results = list[Any]
"""Parsed JSON of each tool result so far, in order."""


@dataclass(frozen=True)
class Step:
    """One reference tool call; `args` sees the results of the steps before it."""

    tool: str
    args: Callable[[Results], dict[str, Any]]


@dataclass(frozen=True)
class TaskSpec:
    """A task with its ground truth and its reference solution."""

    family: str
    question: str
    ground_truth: dict[str, Any]
    steps: tuple[Step, ...]
    answer: Callable[[Results], str]


class NoTask(Exception):
    """These parameters do not make a well-defined question; draw others."""


def first(results: Results, index: int, key: str, field: str, **match: str) -> Any:
    """`field` of the first row under `key` in result `index` whose columns equal `match`."""
    for row in results[index][key]:
        if all(row.get(k) == v for k, v in match.items()):
            return row[field]
    raise LookupError(f"no {key} row with {match}")


def join_ids(results: Results, index: int, key: str, field: str) -> str:
    """The distinct `field` values of the rows under `key` in result `index`, comma-separated."""
    return ", ".join(dict.fromkeys(str(row[field]) for row in results[index][key]))


def exact(answer: list[str]) -> dict[str, Any]:
    """The ground truth of a set-valued (or single-valued) answer."""
    return {"type": "exact", "answer": answer}


def month_range(month: str) -> tuple[str, str]:
    """The first and last day (ISO dates) of `YYYY-MM`."""
    start = dt.date.fromisoformat(month + "-01")
    end = (start.replace(day=28) + dt.timedelta(days=4)).replace(day=1) - dt.timedelta(days=1)
    return start.isoformat(), end.isoformat()


def months(data: CrmData) -> list[str]:
    """Every `YYYY-MM` in which a case was opened."""
    return sorted({c["opened_at"][:7] for c in data.cases})


def unique_contact(data: CrmData, rng: random.Random) -> dict[str, Any]:
    """A random contact whose full name no other contact has (else `NoTask`)."""
    names = Counter(f"{c['first_name']} {c['last_name']}" for c in data.contacts)
    contact = rng.choice(data.contacts)
    if names[f"{contact['first_name']} {contact['last_name']}"] != 1:
        raise NoTask
    return contact
