"""Spreadsheet tasks: a strict SpreadsheetBench loader, the generated datasets, prompts and staging.

A SpreadsheetBench directory holds ``dataset.json`` (rows with id, instruction, instruction_type,
answer_position, spreadsheet_path) and per row ``N_ID_input.xlsx`` / ``N_ID_answer.xlsx`` test
cases. Each case becomes one Task with id ``ID:N``.

Design decisions:

* Payloads stay small. ``Task.init_args`` carries the input workbook's *path* (plus, for generated
  tasks, the generator coordinates), never its bytes; the worker reads the file at init. So
  workers must see the dataset directory at the same path (a shared or identical filesystem) for
  SpreadsheetBench data; generated tasks need no shared files, a worker rebuilds the input from the
  coordinates (and refuses if its generator differs from the client's).
* Answers never enter the workspace. A SpreadsheetBench task's ground truth names its answer
  workbook's path, read by the reward in the worker only (the sandbox never binds it). Generated
  tasks embed the expected cells, normalised, and no answer file is written for them at all.
* The prompt shows a bounded preview (sheet names, sizes, the top-left rows and columns), never
  the whole sheet, and a ``Task id:`` line (what the reference policy rebuilds the task from).
* The loader is strict: a bad row raises `DatasetError` naming the file, the row, its id and the
  field; a broken input workbook is reported at load time, not in the middle of a rollout.
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Any

from gymflow.envs.builtin.sheets import book, generate
from gymflow.envs.builtin.sheets.families import CELL_LEVEL, SHEET_LEVEL
from gymflow.envs.contract import Task
from gymflow.envs.errors import DatasetError

INPUT_NAME = "input.xlsx"
"""The input workbook's name in the workspace."""
OUTPUT_NAME = "output.xlsx"
"""Where the model must save its result; the only file the reward reads."""
TASK_ID_PREFIX = "Task id: "
"""Start of the prompt line naming the task."""
MAX_INPUT_BYTES = 64 * 1024 * 1024
"""Largest input workbook staged into a workspace."""
INSTRUCTION_TYPES = (CELL_LEVEL, SHEET_LEVEL)
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PROMPT = """{prefix}{task_id}
Instruction: {instruction}
Instruction type: {instruction_type}
Answer position: {answer_position}

The workbook is {input} in your working directory. Save the finished workbook as {output} (keep \
every sheet). Only the cells of the answer position in {output} are checked, by value; formulas \
count, they are recalculated.

Preview of {input}:
{preview}"""


def render_prompt(task_id: str, row: dict[str, Any], view: str) -> str:
    """The user prompt of one task."""
    return _PROMPT.format(
        prefix=TASK_ID_PREFIX,
        task_id=task_id,
        instruction=row["instruction"].strip(),
        instruction_type=row["instruction_type"],
        answer_position=row["answer_position"],
        input=INPUT_NAME,
        output=OUTPUT_NAME,
        preview=view,
    )


def _plain(value: Any) -> str:
    if isinstance(value, datetime.datetime) and value.time() == datetime.time(0):
        return value.date().isoformat()
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    return str(value).replace("\n", " ")


def preview(path: str, *, rows: int = 8, cols: int = 8, sheets: int = 4, width: int = 24) -> str:
    """A bounded view of a workbook for a prompt: sheet names, sizes and the top-left corner."""
    workbook = book.load(path, read_only=True)
    names = workbook.sheetnames
    out = [f"Sheets: {', '.join(repr(s) for s in names)}"]
    for ws in workbook.worksheets[:sheets]:
        max_row, max_col = ws.max_row or 0, ws.max_column or 0
        out.append(f"\nSheet {ws.title!r}: {max_row} rows x {max_col} columns (first {min(rows, max_row)} rows)")
        shown = min(cols, max_col)
        out.append("    | " + " | ".join(book.column_letter(c) for c in range(1, shown + 1)))
        for r, row in enumerate(ws.iter_rows(min_row=1, max_row=min(rows, max_row), max_col=shown, values_only=True)):
            texts = ["" if v is None else _plain(v)[:width] for v in row]
            out.append(f"{r + 1:>3} | " + " | ".join(texts))
        if max_row > rows or max_col > cols:
            out.append(f"    ... ({max(max_row - rows, 0)} more rows, {max(max_col - cols, 0)} more columns)")
    if len(names) > sheets:
        out.append(f"\n... {len(names) - sheets} more sheets")
    workbook.close()
    return "\n".join(out)


def parse_task_id(prompt: str) -> str | None:
    """The task id a prompt names, or None."""
    match = re.search(rf"^{re.escape(TASK_ID_PREFIX)}(\S+)", prompt, re.MULTILINE)
    return match.group(1) if match else None


def load_spreadsheetbench(path: Path, *, limit: int | None = None, answers: bool = True) -> list[Task]:
    """Tasks of a SpreadsheetBench directory (or its dataset.json), one per test case.

    Raises:
        DatasetError: A row is invalid or its files are missing or broken; the message names it.
    """
    root = path.parent if path.is_file() else path
    manifest = root / "dataset.json"
    if not manifest.is_file():
        raise DatasetError(f"{manifest}: no such file (a SpreadsheetBench directory holds dataset.json)")
    try:
        rows = json.loads(manifest.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{manifest}: not a readable JSON file: {exc}") from None
    if not isinstance(rows, list):
        raise DatasetError(f"{manifest}: must hold a JSON list of rows, got {type(rows).__name__}")
    tasks: list[Task] = []
    for i, row in enumerate(rows):
        if limit is not None and len(tasks) >= limit:
            break
        tasks.extend(row_tasks(root, row, where=f"{manifest}: row {i}", answers=answers))
    return tasks[:limit]


def _field(row: dict[str, Any], name: str, where: str) -> str:
    value = row.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and name == "id":
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{where}: field {name!r} must be a non-empty string, got {value!r}")
    return value


def row_tasks(root: Path, row: Any, *, where: str, answers: bool = True) -> list[Task]:
    """The Tasks (one per test case) of one dataset.json row (`answers`: each case has an answer workbook)."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    rid = _field(row, "id", where)
    where = f"{where} (id {rid})"
    if not _ID_RE.match(rid):
        raise DatasetError(f"{where}: field 'id' may only hold letters, digits, '_', '.' and '-'")
    fields = {name: _field(row, name, where) for name in ("instruction", "instruction_type", "answer_position")}
    if fields["instruction_type"] not in INSTRUCTION_TYPES:
        raise DatasetError(f"{where}: field 'instruction_type' must be one of {INSTRUCTION_TYPES}")
    try:
        book.parse_position(fields["answer_position"])
    except book.BookError as exc:
        raise DatasetError(f"{where}: field 'answer_position': {exc}") from None
    given = _field(row, "spreadsheet_path", where)
    try:
        folder = (root / given).resolve()
        inside = root.resolve() in folder.parents and folder.is_dir()
    except (OSError, ValueError) as exc:  # a name too long for the file system, a NUL byte
        raise DatasetError(f"{where}: field 'spreadsheet_path' is not a usable path: {str(exc)[:120]}") from None
    if not inside:
        raise DatasetError(f"{where}: field 'spreadsheet_path' must name a folder inside {root}")
    cases = sorted(int(p.name.split("_", 1)[0]) for p in folder.glob(f"*_{rid}_input.xlsx") if p.name[0].isdigit())
    if not cases:
        raise DatasetError(f"{where}: no test case: expected {folder}/1_{rid}_input.xlsx")
    extra = {k: v for k, v in row.items() if k not in {"id", "spreadsheet_path", *fields}}
    tasks = []
    for case in cases:
        source, answer = folder / f"{case}_{rid}_input.xlsx", folder / f"{case}_{rid}_answer.xlsx"
        if answers and not answer.is_file():
            raise DatasetError(f"{where}: test case {case} has no answer workbook {answer.name}")
        try:
            text = preview(str(source))
        except book.BookError as exc:
            raise DatasetError(f"{where}: test case {case}: {exc}") from None
        task_id = f"{rid}:{case}"
        tasks.append(
            Task(
                id=task_id,
                prompt=render_prompt(task_id, fields, text),
                ground_truth={"answer_position": fields["answer_position"]}
                | ({"answer_path": str(answer)} if answers else {}),
                init_args={"input_path": str(source)},
                metadata={
                    "source": "generated" if "generator" in extra else "spreadsheetbench",
                    "row_id": rid,
                    "case": case,
                    "instruction_type": fields["instruction_type"],
                    **extra,
                },
            )
        )
    return tasks


def expected_cells(drawn: generate.Spec) -> dict[str, Any]:
    """Areas and normalised expected cells of a generated task (what its answer workbook holds)."""
    areas, cells = [], []
    for area in book.parse_position(drawn.answer_position):
        sheet = area.sheet or next(iter(drawn.sheets))
        areas.append([sheet, area.ref()])
        values = drawn.answer.get(sheet, {})
        cells += [[sheet, coord, book.normalize(values.get(coord))] for coord in area.coords()]
    return {"areas": areas, "cells": cells}


def load_generated(n: int, *, seed: int = 0, root: Path | None = None) -> list[Task]:
    """`n` generated tasks of `seed` (inputs cached under `root`, no answers), through the SpreadsheetBench loader."""
    directory = generate.write_dataset(n, seed=seed, root=root)
    tasks = load_spreadsheetbench(directory, limit=n, answers=False)
    for task in tasks:
        coords = task.metadata["generator"]
        task.ground_truth |= expected_cells(generate.spec(coords["seed"], coords["index"]))
        task.init_args["generator"] = coords
    return tasks


def input_bytes(*, input_path: str, generator: dict[str, Any] | None = None) -> bytes:
    """The input workbook a task's init_args name, rebuilt from the generator when not on this machine.

    Raises:
        ValueError: The file is missing (and cannot be rebuilt), too large, or was generated by a
            different generator than this worker's.
    """
    path = Path(input_path)
    if generator is not None and not path.is_file():
        if generator.get("version") != generate.VERSION or generator.get("fingerprint") != generate.fingerprint():
            raise ValueError(
                f"task was generated by generator {generator.get('version')}/{generator.get('fingerprint')}, "
                f"this worker has {generate.VERSION}/{generate.fingerprint()}: run the same gymflow version"
            )
        return generate.input_workbook(int(generator["seed"]), int(generator["index"]))
    if not path.is_file():
        raise ValueError(
            f"input workbook {path} is not on this worker: SpreadsheetBench tasks are staged by path, "
            "so every worker must see the dataset directory at the same path"
        )
    size = path.stat().st_size
    if size > MAX_INPUT_BYTES:
        raise ValueError(f"input workbook {path} is {size} bytes, over the {MAX_INPUT_BYTES}-byte limit")
    return path.read_bytes()
