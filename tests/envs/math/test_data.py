"""Math task generation and JSONL loading."""

import json
import re
from pathlib import Path

import pytest

from gymflow.envs.builtin.math.data import PROMPT_PREFIX, PROMPT_SUFFIX, generate_tasks, load_jsonl
from gymflow.envs.builtin.math.servers.calculator import evaluate_expression
from gymflow.envs.contract import Task
from gymflow.envs.errors import DatasetError


def test_same_seed_same_tasks() -> None:
    assert generate_tasks(20, seed=3) == generate_tasks(20, seed=3)
    assert generate_tasks(5, seed=3) == generate_tasks(20, seed=3)[:5]
    assert generate_tasks(20, seed=3) != generate_tasks(20, seed=4)


def test_ids_prompt_and_metadata() -> None:
    tasks = generate_tasks(3, seed=7, difficulty=2, prefix="arith")
    assert [t.id for t in tasks] == ["arith-7-0", "arith-7-1", "arith-7-2"]
    for task in tasks:
        assert isinstance(task.prompt, str)
        first, second = task.prompt.split("\n")
        assert first == PROMPT_PREFIX + task.metadata["expression"]
        assert second == PROMPT_SUFFIX
        assert task.metadata["difficulty"] == 2
        assert Task.model_validate_json(task.model_dump_json()) == task


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 6])
def test_ground_truth_is_the_exact_integer_value(difficulty: int) -> None:
    for seed in range(3):
        for task in generate_tasks(100, seed=seed, difficulty=difficulty):
            expression = task.metadata["expression"]
            assert len(re.findall(r" [-+*/] ", expression)) == difficulty
            assert re.fullmatch(r"[0-9 ()+\-*/]+", expression)
            assert task.ground_truth == str(evaluate_expression(expression))
            assert re.fullmatch(r"-?\d+", task.ground_truth)


def test_generated_tasks_use_every_operator() -> None:
    text = " ".join(t.metadata["expression"] for t in generate_tasks(50, difficulty=3))
    for op in " + ", " - ", " * ", " / ", "(":
        assert op in text


def test_generate_rejects_bad_arguments() -> None:
    assert generate_tasks(0) == []
    with pytest.raises(ValueError, match="difficulty"):
        generate_tasks(1, difficulty=0)
    with pytest.raises(ValueError, match="n must"):
        generate_tasks(-1)


def _write(tmp_path: Path, *lines: str, name: str = "probs.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_jsonl_accepts_both_shapes(tmp_path: Path) -> None:
    full = Task(id="t-full", prompt="What is 2 + 2?", ground_truth="4", metadata={"split": "test"})
    path = _write(
        tmp_path,
        json.dumps({"question": "What is 1 + 1?", "answer": "2"}),
        "",
        json.dumps({"id": "custom", "prompt": "Half of 1?", "answer": 0.5}),
        "   ",
        json.dumps({"question": "Six?", "answer": 6.0, "metadata": {"level": 1}}),
        full.model_dump_json(),
    )
    tasks = load_jsonl(path)
    assert [t.id for t in tasks] == ["probs-1", "custom", "probs-5", "t-full"]
    assert [t.ground_truth for t in tasks] == ["2", "0.5", "6", "4"]
    assert tasks[0].prompt == "What is 1 + 1?"
    assert tasks[2].metadata == {"level": 1}
    assert tasks[3] == full


@pytest.mark.parametrize(
    ("lines", "line", "needle"),
    [
        (['{"question": "q", "answer": 1', ""], 1, "invalid JSON"),
        (['{"question": "q", "answer": 1}', "[1, 2]"], 2, "JSON object"),
        (['{"answer": 1}'], 1, "'question'"),
        (['{"question": 3, "answer": 1}'], 1, "'question'"),
        (['{"prompt": "  ", "answer": 1}'], 1, "'prompt'"),
        (['{"question": "q"}'], 1, "'answer'"),
        (['{"question": "q", "answer": [1]}'], 1, "'answer'"),
        (['{"question": "q", "answer": true}'], 1, "'answer'"),
        (['{"question": "q", "answer": ""}'], 1, "'answer'"),
        (['{"question": "q", "answer": 1, "id": ""}'], 1, "'id'"),
        (['{"question": "q", "answer": 1, "metadata": 3}'], 1, "'metadata'"),
        (['{"question": "q", "answer": 1, "solution": "x"}'], 1, "solution"),
        (['{"question": "q", "prompt": "p", "answer": 1}'], 1, "not both"),
        (['{"id": "a", "question": "q", "answer": 1}', "", '{"id": "a", "question": "r", "answer": 2}'], 3, "'id'"),
        (['{"id": "a", "prompt": "q", "ground_truth": "1", "bogus": 1}'], 1, "'bogus'"),
        (['{"id": "a", "prompt": 5, "ground_truth": "1"}'], 1, "'prompt"),
        (['{"id": "a", "prompt": "q", "ground_truth": null}'], 1, "'ground_truth'"),
    ],
)
def test_load_jsonl_errors_name_line_and_field(tmp_path: Path, lines: list[str], line: int, needle: str) -> None:
    path = _write(tmp_path, *lines)
    with pytest.raises(DatasetError) as caught:
        load_jsonl(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert needle in message


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_load_jsonl_rejects_blank_files(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DatasetError, match=r"empty\.jsonl:1: .*no rows"):
        load_jsonl(path)


def test_load_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="cannot read"):
        load_jsonl(tmp_path / "absent.jsonl")
