"""What an agentic judge is asked and how its answer is read (pure: the rollout workflow builds the
judge's task with it, and the judge env scores the judge's final answer with it)."""

from __future__ import annotations

import re

from gymflow.envs.contract import Message, Task
from gymflow.envs.rewards.judge import bound, render_transcript

_SCORE = re.compile(r"<score>\s*([0-9]*\.?[0-9]+)\s*</score>")


def judge_task(task: Task, messages: list[Message], *, source: str, instructions: str, max_chars: int = 24_000) -> Task:
    """The judge's task for a rollout of `task` whose conversation is `messages` and whose workspace
    is the directory `source` (on the node that runs the judge)."""
    prompt = task.prompt if isinstance(task.prompt, str) else render_transcript(task.prompt)
    text = (
        f"## Instructions\n{instructions}\n\n## The agent's task\n{bound(prompt, 8_000)}\n\n"
        f"## The agent's transcript\n{bound(render_transcript(messages), max_chars)}"
    )
    return Task(id=f"{task.id}:judge", prompt=text, init_args={"source": source}, metadata={"judges": task.id})


def score_of(text: str) -> float:
    """The last ``<score>`` of the judge's final answer, in [0, 1].

    Raises:
        ValueError: No score, or one outside [0, 1].
    """
    found = _SCORE.findall(text)
    if not found:
        raise ValueError("the judge ended without a <score>X</score>")
    score = float(found[-1])
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"the judge's score {score} is outside [0, 1]")
    return score
