"""CRM tasks in the style of CRMArena-Pro: questions over the database, with exact, fuzzy and refusal answers.

Twelve families, cycled through by task index:

| family | asks for | answer | reward |
| --- | --- | --- | --- |
| open_cases, escalated_cases, product_buyers | a set of ids | ``id, id, ...`` | set IoU |
| top_agent, fastest_agent, account_owner, contact_email | one id or e-mail | the value | set IoU (1 or 0) |
| order_total | a sum of orders | ``1234.56`` | numeric, to the cent |
| kb_answer, transcript_issue | a sentence from an article or a chat | free text | token F1 |
| privacy_personal, privacy_bulk | personal data of contacts | ``REFUSE`` | 1 iff refused and nothing leaked |

Design decisions:

* A task is a function of (seed, index): `task_spec` rebuilds it from the id alone (``crm-s0-00017``),
  which is how the reference policy, behind an HTTP endpoint, knows the task without any file.
* Ground truths come from the generated rows in Python (gymflow.envs.builtin.crm.db), never from SQL.
* Each spec carries its reference solution as tool calls: `Step`s whose arguments may depend on
  the results of earlier steps, and an `answer` function of all results. The reference policy
  (gymflow.envs.builtin.crm.policy) only ever answers from tool results, so its reward of 1.0 checks the tools too.
* Parameters are drawn until the question has a well-defined answer (a unique winner, a
  non-empty set, an unambiguous name), with a deterministic generator per task.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable

from gymflow.envs.builtin.crm import db, families, families_text
from gymflow.envs.builtin.crm.db import CrmData
from gymflow.envs.builtin.crm.spec import NoTask, TaskSpec
from gymflow.envs.contract import Task

TASK_ID_PREFIX = "Task id: "
_ID_RE = re.compile(r"^crm-s(\d+)-(\d{5})$")

FAMILIES: tuple[Callable[[CrmData, random.Random], TaskSpec], ...] = (
    families.open_cases,
    families.top_agent,
    families_text.kb_answer,
    families.order_total,
    families_text.privacy_personal,
    families.escalated_cases,
    families.account_owner,
    families_text.transcript_issue,
    families.product_buyers,
    families.fastest_agent,
    families.contact_email,
    families_text.privacy_bulk,
)
FAMILY_NAMES = tuple(f.__name__ for f in FAMILIES)


def task_id(seed: int, index: int) -> str:
    """The id of task `index` of the dataset of `seed`."""
    return f"crm-s{seed}-{index:05d}"


def parse_task_id(text: str) -> tuple[int, int] | None:
    """(seed, index) of a task id, or of the ``Task id:`` line of a prompt; None for any other text."""
    for line in text.splitlines():
        candidate = line.removeprefix(TASK_ID_PREFIX).strip() if line.startswith(TASK_ID_PREFIX) else line.strip()
        if match := _ID_RE.match(candidate):
            return int(match.group(1)), int(match.group(2))
    return None


@functools.lru_cache(maxsize=4096)
def task_spec(seed: int, index: int) -> TaskSpec:
    """Task `index` of the dataset of `seed`, rebuilt deterministically."""
    if index < 0:
        raise ValueError(f"task index must be >= 0, got {index}")
    data = db.generate(seed)
    family = FAMILIES[index % len(FAMILIES)]
    rng = random.Random(f"crm-task-v{db.VERSION}-{seed}-{index}")
    for _ in range(200):
        try:
            return family(data, rng)
        except NoTask:
            continue
    raise RuntimeError(f"no well-defined {family.__name__} task for seed {seed} index {index}")


def make_task(seed: int, index: int) -> Task:
    """The `Task` of (seed, index): prompt with its id line, ground truth, and the database to stage."""
    spec = task_spec(seed, index)
    return Task(
        id=task_id(seed, index),
        prompt=f"{TASK_ID_PREFIX}{task_id(seed, index)}\n{spec.question}",
        ground_truth=spec.ground_truth | {"family": spec.family},
        init_args={"db_seed": seed},
        metadata={"family": spec.family, "reward": spec.ground_truth["type"]},
    )


def generate_tasks(n: int, *, seed: int = 0, offset: int = 0) -> list[Task]:
    """`n` tasks of the dataset of `seed`, families in turn."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [make_task(seed, offset + i) for i in range(n)]
