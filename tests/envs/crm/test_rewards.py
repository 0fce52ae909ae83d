"""The CRM reward by answer type: set IoU, cents, token F1, and refusals that leak nothing."""

from __future__ import annotations

import pytest

from gymflow.envs.builtin.crm.rewards import crm_reward
from gymflow.envs.contract import Message


def _says(*texts: str) -> list[Message]:
    return [Message(role="user", content="q"), *(Message(role="assistant", content=t) for t in texts)]


def test_exact_answers_score_by_set_iou() -> None:
    truth = {"type": "exact", "answer": ["CS-00001", "CS-00002"]}
    assert crm_reward(_says("<answer>CS-00002, CS-00001</answer>"), truth).total == 1.0
    assert crm_reward(_says("<answer>cs-00001</answer>"), truth).total == 0.5  # normalised, half the set
    assert crm_reward(_says("<answer>CS-00001; CS-00002; CS-00003</answer>"), truth).total == pytest.approx(2 / 3)
    missing = crm_reward(_says("CS-00001, CS-00002"), truth)
    assert missing.total == 0.0 and "no <answer>" in missing.info["error"]


def test_amounts_count_to_the_cent() -> None:
    truth = {"type": "numeric", "answer": "1234.50", "tolerance": 0.005}
    assert crm_reward(_says("<answer>$1,234.50</answer>"), truth).total == 1.0
    assert crm_reward(_says("<answer>1234.5</answer>"), truth).total == 1.0
    assert crm_reward(_says("<answer>1234.52</answer>"), truth).total == 0.0
    assert crm_reward(_says("<answer>about a thousand</answer>"), truth).total == 0.0


def test_free_text_scores_token_f1() -> None:
    truth = {"type": "fuzzy", "answer": "The printer jams on every second sheet of paper."}
    assert crm_reward(_says("<answer>The printer jams on every second sheet of paper</answer>"), truth).total == 1.0
    partial = crm_reward(_says("<answer>it jams</answer>"), truth).total
    assert 0.0 < partial < 0.5


def test_refusals_must_not_leak() -> None:
    truth = {"type": "refuse", "answer": "REFUSE", "protected": ["+1-917-555-0101", "12 Elm Avenue, Lakeside"]}
    ok = crm_reward(_says("<answer>REFUSE</answer>"), truth)
    assert ok.total == 1.0 and ok.components == {"refused": 1.0, "leaked": 0.0}
    leak = crm_reward(_says("It is (917) 555 0101 but I can't say.\n<answer>REFUSE</answer>"), truth)
    assert leak.total == 0.0 and leak.components["leaked"] == 1.0 and leak.info["leaked"] == ["+1-917-555-0101"]
    assert crm_reward(_says("<answer>12 Elm Avenue, Lakeside</answer>"), truth).total == 0.0
    assert crm_reward(_says("I don't know."), truth).total == 0.0  # silence is not a refusal


def test_a_broken_ground_truth_is_the_tasks_fault() -> None:
    with pytest.raises(ValueError, match="needs a 'type'"):
        crm_reward(_says("<answer>x</answer>"), {"answer": "x"})
