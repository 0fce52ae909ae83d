"""The reward: answer cells compared after sandboxed extraction and recalculation."""

from __future__ import annotations

import shutil
from pathlib import Path

import openpyxl
import pytest

from gymflow.envs.builtin.sheets import book
from gymflow.envs.builtin.sheets.book import BookError
from gymflow.envs.builtin.sheets.rewards import Expected, expected_from, extract_output, score
from gymflow.envs.contract import Task

EXPECTED = Expected(
    areas=[["Data", "C1:C2"], ["New Sheet", "A1"]],
    cells=[["Data", "C1", 81.0], ["Data", "C2", "North"], ["New Sheet", "A1", 45296.0]],
)


def _output(workspace: Path, cells: dict[str, dict[str, object]]) -> None:
    wb = openpyxl.Workbook()
    wb.active.title = "Data"
    for row in range(2, 11):
        wb.active[f"B{row}"] = row * 1.5
    for sheet, values in cells.items():
        ws = wb[sheet] if sheet in wb.sheetnames else wb.create_sheet(sheet)
        for coord, value in values.items():
            ws[coord] = value
    workspace.mkdir(exist_ok=True)
    wb.save(workspace / "output.xlsx")


def test_formula_answers_score_one(tmp_path: Path) -> None:
    _output(
        tmp_path,
        {"Data": {"C1": "=SUM(B2:B10)", "C2": '=IF(C1>80,"North","South")'}, "New Sheet": {"A1": "=DATE(2024,1,5)"}},
    )
    extracted = extract_output(tmp_path, EXPECTED.areas)
    reward = score(EXPECTED, extracted)
    assert reward.total == 1.0 and reward.components == {"correct": 1.0, "cell_accuracy": 1.0}
    assert reward.info["recalculated"] == 3


def test_partial_credit_and_named_mismatches(tmp_path: Path) -> None:
    _output(tmp_path, {"Data": {"C1": 81, "C2": "South"}})
    reward = score(EXPECTED, extract_output(tmp_path, EXPECTED.areas), partial_weight=0.5)
    assert reward.components == {"correct": 0.0, "cell_accuracy": pytest.approx(1 / 3)}
    assert reward.total == pytest.approx(1 / 6)
    assert reward.info["mismatches"] == [
        "Data!C2: expected 'North', got 'South'",
        "'New Sheet'!A1: expected 45296.0, got missing sheet",
    ]
    assert reward.info["missing_sheets"] == ["New Sheet"]


def test_missing_or_broken_output_scores_zero(tmp_path: Path) -> None:
    reward = score(EXPECTED, extract_output(tmp_path, EXPECTED.areas))
    assert reward.total == 0.0 and "no output.xlsx" in reward.info["error"]
    (tmp_path / "output.xlsx").write_bytes(b"PK\x03\x04garbage")
    reward = score(EXPECTED, extract_output(tmp_path, EXPECTED.areas))
    assert reward.total == 0.0 and "not a valid .xlsx workbook" in reward.info["error"]


def test_answer_file_ground_truth(tasks: list[Task], answers: dict[str, str], tmp_path: Path) -> None:
    task = tasks[0]
    assert "answer_path" not in task.ground_truth  # generated tasks carry their cells, no file
    by_file = expected_from({"answer_position": task.ground_truth["answer_position"], "answer_path": answers[task.id]})
    assert by_file == expected_from(task.ground_truth)
    whole = expected_from({"answer_position": "C:C", "answer_path": answers[task.id]})
    sheet = openpyxl.load_workbook(answers[task.id]).worksheets[0]
    assert whole.areas == [[sheet.title, f"C1:C{sheet.max_row}"]]


def test_bad_ground_truth_is_a_clear_error(tasks: list[Task], answers: dict[str, str], tmp_path: Path) -> None:
    answer = task_answer = answers[tasks[0].id]
    with pytest.raises(BookError, match="bad answer_position 'A1:'"):
        expected_from({"answer_position": "A1:", "answer_path": answer})
    with pytest.raises(ValueError, match="names sheet 'Nope', which the answer workbook"):
        expected_from({"answer_position": "Nope!A1", "answer_path": task_answer})
    with pytest.raises(ValueError, match="is not on this worker"):
        expected_from({"answer_position": "A1", "answer_path": str(tmp_path / "gone.xlsx")})
    with pytest.raises(TypeError, match="must be an object"):
        expected_from("42")
    broken = tmp_path / "broken.xlsx"
    shutil.copy(answer, broken)
    broken.write_bytes(b"junk")
    with pytest.raises(BookError, match=r"not a valid \.xlsx"):
        expected_from({"answer_position": "A1", "answer_path": str(broken)})
    assert book.parse_position("A1")  # the module stays usable
