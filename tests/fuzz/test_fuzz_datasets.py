"""Fuzzed dataset rows: the math JSONL loader, the SpreadsheetBench row loader and Task validation
return valid Tasks or raise their documented error naming the row — never anything else."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from fuzzing import SIZES, Tally, fuzz_settings, hostile_text, huge_strings, json_values
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gymflow.envs.builtin.math.data import load_jsonl
from gymflow.envs.builtin.math.env import MathEnv
from gymflow.envs.builtin.sheets import data as sheets_data
from gymflow.envs.contract import Task
from gymflow.envs.errors import DatasetError

MATH_ROW = {"id": "q1", "question": "What is 2 + 3?", "answer": 5, "metadata": {"difficulty": 1}}
TASK_ROW = {"id": "t1", "prompt": "2+3?", "ground_truth": "5", "init_args": {}, "metadata": {}}
SHEET_ROW = {
    "id": "59196",
    "instruction": "Put 3 in C1.",
    "instruction_type": "Cell-Level Manipulation",
    "answer_position": "'Sheet1'!C1",
    "spreadsheet_path": "spreadsheet/59196",
}


def mutated(row: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """`row` with some fields replaced by hostile values, maybe some dropped, maybe an extra one."""
    hostile = st.one_of(json_values(), hostile_text(), st.sampled_from(["", " ", "../../etc", "/etc/passwd", "0"]))
    fields = {k: st.one_of(st.just(v), st.one_of(hostile, st.just(None))) for k, v in row.items()}
    kept = st.one_of(st.fixed_dictionaries(fields), st.fixed_dictionaries({}, optional=fields))
    extra = st.one_of(st.just({}), st.dictionaries(st.text(max_size=12), hostile, max_size=2))
    return st.builds(lambda e, k: {**e, **k}, extra, kept)


def jsonl_line() -> st.SearchStrategy[str]:
    return st.one_of(
        mutated(MATH_ROW).map(json.dumps),
        mutated(TASK_ROW).map(json.dumps),
        st.just(json.dumps(MATH_ROW)),
        json_values().map(json.dumps),
        hostile_text().map(lambda t: t.replace("\n", " ")),
        st.sampled_from(["", "   ", "\ufeff{}", "\x00"]),
    )


@pytest.mark.parametrize("examples", SIZES)
def test_fuzzed_math_jsonl_loads_or_names_the_bad_row(examples: int) -> None:
    tally = Tally()

    @fuzz_settings(examples)
    @given(lines=st.lists(jsonl_line(), max_size=6), raw=st.none() | st.binary(max_size=200))
    def check(lines: list[str], raw: bytes | None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "rows.jsonl"
            path.write_bytes(raw if raw is not None else "\n".join(lines).encode("utf-8", errors="surrogatepass"))
            try:
                tasks = load_jsonl(path)
            except DatasetError as exc:
                assert str(exc).startswith(str(path)), exc  # names the file (and line)
                tally.case("dataset_error")
                return
        assert tasks and all(isinstance(t, Task) for t in tasks)
        assert len({t.id for t in tasks}) == len(tasks)
        tally.case("loaded")
        tally["tasks"] += len(tasks)

    check()
    tally.record("fuzz", f"dataset rows -> math load_jsonl ({examples} examples)")


@pytest.fixture(scope="module")
def bench_root() -> Iterator[Path]:
    """A SpreadsheetBench directory with one real row (two test cases)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = root / "spreadsheet" / "59196"
        folder.mkdir(parents=True)
        for case in (1, 2):
            book = openpyxl.Workbook()
            book.active.title = "Sheet1"
            book.active.append(["a", "b"])
            book.save(folder / f"{case}_59196_input.xlsx")
            book.active["C1"] = 3
            book.save(folder / f"{case}_59196_answer.xlsx")
        (root / "outside.xlsx").write_bytes(b"not a workbook")
        yield root


@pytest.mark.parametrize("examples", SIZES)
def test_fuzzed_spreadsheetbench_rows_load_or_name_the_bad_field(bench_root: Path, examples: int) -> None:
    tally = Tally()

    @fuzz_settings(examples)
    @given(row=st.one_of(mutated(SHEET_ROW), json_values(), st.just(SHEET_ROW)))
    def check(row: Any) -> None:
        try:
            tasks = sheets_data.row_tasks(bench_root, row, where="dataset.json: row 0")
        except DatasetError as exc:
            assert str(exc).startswith("dataset.json: row 0"), exc
            tally.case("dataset_error")
            return
        assert [t.id for t in tasks] == [f"{row['id']}:1", f"{row['id']}:2"]
        assert all(Path(t.init_args["input_path"]).resolve().is_relative_to(bench_root.resolve()) for t in tasks)
        tally.case("loaded")

    check()
    tally.record("fuzz", f"dataset rows -> SpreadsheetBench loader ({examples} examples)")


@pytest.mark.parametrize("examples", SIZES)
def test_fuzzed_task_objects_validate_or_raise_validation_errors(examples: int) -> None:
    tally = Tally()

    @fuzz_settings(examples)
    @given(value=st.one_of(mutated(TASK_ROW), mutated(MATH_ROW), json_values(), huge_strings()))
    def check(value: Any) -> None:
        try:
            task = Task.model_validate(value)
        except ValidationError:
            tally.case("validation_error")
        else:
            assert task.id and task.opening_messages()
            assert Task.model_validate_json(task.model_dump_json()) == task  # what goes in comes back out
            tally.case("task")
        if isinstance(value, dict):
            try:
                MathEnv.dataset_preprocess(value)
            except (ValidationError, ValueError, KeyError, TypeError) as exc:
                assert not isinstance(exc, KeyError), exc
                tally["preprocess_errors"] += 1

    check()
    tally.record("fuzz", f"dataset rows -> Task validation ({examples} examples)")
