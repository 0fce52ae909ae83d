"""The SpreadsheetBench loader, the generator, prompts and input staging."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import openpyxl
import pytest

from gymflow.envs.builtin.sheets import data, generate
from gymflow.envs.builtin.sheets.families import FAMILIES
from gymflow.envs.contract import Task
from gymflow.envs.errors import DatasetError


def _bench(tmp_path: Path, rows: list[dict[str, Any]], *, files: bool = True) -> Path:
    root = tmp_path / "bench"
    for row in rows:
        folder = root / "spreadsheet" / str(row.get("id", "x"))
        folder.mkdir(parents=True, exist_ok=True)
        if files:
            for case in (1, 2):
                wb = openpyxl.Workbook()
                wb.active.title = "Sheet1"
                wb.active.append(["a", "b"])
                wb.save(folder / f"{case}_{row.get('id')}_input.xlsx")
                wb.active["C1"] = 3
                wb.save(folder / f"{case}_{row.get('id')}_answer.xlsx")
    (root / "dataset.json").write_text(json.dumps(rows))
    return root


ROW = {
    "id": 59196,
    "instruction": "Put 3 in C1.",
    "instruction_type": "Cell-Level Manipulation",
    "answer_position": "'Sheet1'!C1",
    "spreadsheet_path": "spreadsheet/59196",
}


def test_loads_spreadsheetbench_rows_one_task_per_case(tmp_path: Path) -> None:
    tasks = data.load_spreadsheetbench(_bench(tmp_path, [ROW]))
    assert [t.id for t in tasks] == ["59196:1", "59196:2"]
    task = tasks[1]
    assert task.init_args == {"input_path": str(tmp_path / "bench/spreadsheet/59196/2_59196_input.xlsx")}
    assert task.ground_truth == {
        "answer_position": "'Sheet1'!C1",
        "answer_path": str(tmp_path / "bench/spreadsheet/59196/2_59196_answer.xlsx"),
    }
    assert task.metadata["source"] == "spreadsheetbench" and task.metadata["case"] == 2
    assert isinstance(task.prompt, str)
    assert data.parse_task_id(task.prompt) == "59196:2"
    assert "Answer position: 'Sheet1'!C1" in task.prompt and "Sheets: 'Sheet1'" in task.prompt
    assert data.load_spreadsheetbench(tmp_path / "bench" / "dataset.json", limit=1)[0].id == "59196:1"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"instruction": ""}, "row 0 (id 59196): field 'instruction' must be a non-empty string"),
        ({"instruction_type": "Cell"}, "row 0 (id 59196): field 'instruction_type' must be one of"),
        ({"answer_position": "Sheet1!A1:"}, "row 0 (id 59196): field 'answer_position': bad answer_position"),
        ({"spreadsheet_path": "../../etc"}, "row 0 (id 59196): field 'spreadsheet_path' must name a folder inside"),
        ({"id": "a/b"}, "row 0 (id a/b): field 'id' may only hold"),
        ({"id": None}, "row 0: field 'id' must be a non-empty string"),
        # Found by the fuzzer (tests/fuzz): these escaped as OSError / ValueError.
        ({"spreadsheet_path": "a" * 10_000}, "row 0 (id 59196): field 'spreadsheet_path' is not a usable path"),
        ({"spreadsheet_path": "a\x00b"}, "row 0 (id 59196): field 'spreadsheet_path' is not a usable path"),
    ],
)
def test_invalid_rows_are_named(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    root = _bench(tmp_path, [ROW])
    (root / "dataset.json").write_text(json.dumps([ROW | change]))
    with pytest.raises(DatasetError, match=message.replace("(", r"\(").replace(")", r"\)")):
        data.load_spreadsheetbench(root)


def test_missing_and_broken_files_are_named(tmp_path: Path) -> None:
    root = _bench(tmp_path, [ROW])
    (root / "spreadsheet/59196/2_59196_answer.xlsx").unlink()
    with pytest.raises(DatasetError, match=r"row 0 \(id 59196\): test case 2 has no answer workbook"):
        data.load_spreadsheetbench(root)
    (root / "spreadsheet/59196/1_59196_input.xlsx").write_bytes(b"not a zip")
    with pytest.raises(DatasetError, match=r"test case 1: '1_59196_input.xlsx' is not a valid .xlsx workbook"):
        data.load_spreadsheetbench(root)
    shutil.rmtree(root / "spreadsheet/59196")
    (root / "spreadsheet/59196").mkdir()
    with pytest.raises(DatasetError, match="no test case: expected"):
        data.load_spreadsheetbench(root)
    (root / "dataset.json").write_text("{not json")
    with pytest.raises(DatasetError, match="not a readable JSON file"):
        data.load_spreadsheetbench(root)
    with pytest.raises(DatasetError, match="no such file"):
        data.load_spreadsheetbench(tmp_path / "nowhere")


def test_generated_tasks_are_deterministic_and_in_benchmark_format(tasks: list[Task], tmp_path: Path) -> None:
    again = data.load_generated(18, seed=0, root=tmp_path)
    assert [t.model_dump(exclude={"init_args", "ground_truth"}) for t in again] == [
        t.model_dump(exclude={"init_args", "ground_truth"}) for t in tasks
    ]
    assert [t.ground_truth["cells"] for t in again] == [t.ground_truth["cells"] for t in tasks]
    assert data.load_generated(3, seed=0, root=tmp_path)[2].prompt == tasks[2].prompt  # index i ignores n
    assert {t.metadata["family"] for t in tasks} == set(FAMILIES)
    assert {t.metadata["instruction_type"] for t in tasks} == set(data.INSTRUCTION_TYPES)
    assert any(t.metadata["formula_answer"] for t in tasks) and not all(t.metadata["formula_answer"] for t in tasks)
    assert any("'" in t.ground_truth["answer_position"] for t in tasks)  # quoted sheet names
    assert any("," in t.ground_truth["answer_position"] for t in tasks)  # several areas
    directory = generate.dataset_dir(0, root=tmp_path)
    rows = json.loads((directory / "dataset.json").read_text())
    assert rows[0]["spreadsheet_path"] == f"spreadsheet/{rows[0]['id']}"
    folder = directory / rows[0]["spreadsheet_path"]
    assert (folder / f"1_{rows[0]['id']}_input.xlsx").is_file()
    assert not (folder / f"1_{rows[0]['id']}_answer.xlsx").exists()  # the env never writes answers
    assert all("answer_path" not in t.ground_truth for t in again)
    assert directory.stat().st_mode & 0o077 == 0  # private to the worker's uid
    generate.write_dataset(3, seed=0, root=tmp_path, answers=True)  # the benchmark's full format, on request
    full = data.load_spreadsheetbench(directory, limit=3)
    assert [Path(t.ground_truth["answer_path"]).is_file() for t in full] == [True] * 3
    for task in tasks:
        assert len(task.prompt) < 3000  # a bounded preview, not the sheet
        assert str(directory) not in str(task.prompt)
        assert Path(task.init_args["input_path"]).name.endswith("_input.xlsx")


def test_input_is_rebuilt_on_a_worker_without_the_files(tasks: list[Task], tmp_path: Path) -> None:
    task = tasks[4]
    original = Path(task.init_args["input_path"]).read_bytes()
    moved = dict(task.init_args, input_path=str(tmp_path / "elsewhere/1_x_input.xlsx"))
    rebuilt = data.input_bytes(**moved)
    assert openpyxl.load_workbook(Path(task.init_args["input_path"])).sheetnames == _sheetnames(rebuilt, tmp_path)
    assert len(rebuilt) > 0 and len(original) > 0
    stale = dict(moved, generator=dict(moved["generator"], fingerprint="000000000000"))
    with pytest.raises(ValueError, match="generated by generator"):
        data.input_bytes(**stale)
    with pytest.raises(ValueError, match="every worker must see the dataset directory"):
        data.input_bytes(input_path=str(tmp_path / "gone.xlsx"))


def _sheetnames(content: bytes, tmp_path: Path) -> list[str]:
    path = tmp_path / "rebuilt.xlsx"
    path.write_bytes(content)
    return openpyxl.load_workbook(path).sheetnames
