"""The spreadsheet reward: the output workbook's answer cells against the expected ones, cell by cell.

Two components: ``correct`` (1 when every cell of the answer position matches, SpreadsheetBench's
binary score) and ``cell_accuracy`` (the fraction that match). The total is ``correct`` unless the
env gives partial credit a weight.

Design decisions:

* The model's workbook is only ever opened inside the sandbox (`extract_output` runs
  `gymflow.envs.builtin.sheets.book` there, as the uid that owns the workspace), so a malicious or enormous file
  costs the sandbox's limits and a reward of 0, never the worker. The answer workbook is trusted
  and read in the worker; generated tasks carry their expected cells in the ground truth and need
  no file at all.
* Formula answers count: cells with formulas but no cached value (what openpyxl writes) are
  recalculated by the `formulas` engine inside the same sandbox run.
* A broken output (missing, not a workbook, a sheet missing, the extraction over its limits) is
  the model's failure: reward 0 with the reason in ``info``. A broken ground truth (bad
  answer_position, a missing answer file or sheet) is the task's: a ValueError, which the
  activity reports as a non-retryable reward error instead of a misleading 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gymflow.envs.builtin.sheets import book
from gymflow.envs.builtin.sheets.data import OUTPUT_NAME
from gymflow.envs.builtin.sheets.sandbox import UID_BASE, Level, Limits, Sandbox
from gymflow.envs.contract import Reward

REWARD_LIMITS = Limits(cpu_s=60, wall_s=120.0, memory_mb=2048, file_mb=16, processes=16, output_chars=4_000_000)
"""Limits of the sandboxed extraction (recalculation included); output holds the cells' JSON."""
MAX_COMPARE_CELLS = 50_000
"""Largest answer position compared (whole columns are cut at the answer sheet's used rows)."""
_SHOWN_MISMATCHES = 5


@dataclass(frozen=True)
class Expected:
    """What the answer position must hold."""

    areas: list[list[str]]
    """``[sheet, "A1:B9"]`` with explicit sheets and bounds."""
    cells: list[list[Any]]
    """``[sheet, coord, normalised value]`` for every cell of the areas."""


def expected_from(ground_truth: Any) -> Expected:
    """The expected cells of a task: embedded ones, or read from its answer workbook.

    Raises:
        TypeError: The ground truth is not an object.
        ValueError: The ground truth is malformed, or its answer file or a sheet it names is missing.
    """
    if not isinstance(ground_truth, dict):
        raise TypeError(f"sheets ground truth must be an object, got {type(ground_truth).__name__}")
    if not isinstance(ground_truth.get("answer_position"), str):
        raise ValueError("sheets ground truth needs an 'answer_position' string")  # noqa: TRY004 - a bad value
    areas = book.parse_position(ground_truth["answer_position"])
    if isinstance(ground_truth.get("cells"), list) and isinstance(ground_truth.get("areas"), list):
        return Expected(areas=ground_truth["areas"], cells=ground_truth["cells"])
    path = ground_truth.get("answer_path")
    if not isinstance(path, str) or not Path(path).is_file():
        raise ValueError(
            f"answer workbook {path!r} is not on this worker (ground truth needs 'answer_path' or 'cells')"
        )
    answer = book.load(path, read_only=True)
    resolved = []
    for area in areas:
        sheet = area.sheet or answer.sheetnames[0]
        if sheet not in answer.sheetnames:
            raise ValueError(f"answer_position names sheet {sheet!r}, which the answer workbook {path} lacks")
        resolved.append([sheet, area.bounded(answer[sheet].max_row or 1).ref()])
    answer.close()
    total = sum(book.parse_area(ref).size for _, ref in resolved)
    if total > MAX_COMPARE_CELLS:
        raise ValueError(f"answer_position covers {total} cells, over the {MAX_COMPARE_CELLS}-cell limit")
    return Expected(areas=resolved, cells=book.extract(path, resolved)["cells"])


def extract_output(
    workspace: Path,
    areas: list[list[str]],
    *,
    level: Level | str | None = None,
    own_uid: bool | None = None,
    nice: int = 0,
) -> dict[str, Any]:
    """Run the extraction of `areas` from the workspace's output workbook in the sandbox.

    It runs as the uid that owns the workspace (the rollout's sandbox uid) when there is one, at
    `nice` below the caller.

    Returns:
        `book.extract`'s result, or ``{"error": reason}``.
    """
    if not (workspace / OUTPUT_NAME).is_file():
        return {"error": f"no {OUTPUT_NAME} in the workspace: the model did not save its result"}
    owner = os.stat(workspace).st_uid
    uid = owner if owner >= UID_BASE else None
    sandbox = Sandbox(level=level, own_uid=own_uid, limits=REWARD_LIMITS, uid=uid, nice=nice)
    run = sandbox.run(book.program("extract", path=OUTPUT_NAME, areas=areas), workspace=workspace)
    result = book.parse_result(run.stdout)
    if result is None:
        problem = run.problem() or "no result"
        return {"error": f"reading {OUTPUT_NAME} failed: {problem}: {run.stderr.strip()[-500:]}"}
    if not result.get("ok"):
        return {"error": str(result.get("error"))}
    return result


def score(expected: Expected, extracted: dict[str, Any], *, partial_weight: float = 0.0) -> Reward:
    """Compare extracted output cells with the expected ones.

    Args:
        expected: The expected cells.
        extracted: `extract_output`'s result.
        partial_weight: Weight of ``cell_accuracy`` in the total (0: binary only).

    Returns:
        ``Reward(total, components={"correct", "cell_accuracy"}, info={...})``.
    """
    if "error" in extracted:
        return Reward(total=0.0, components={"correct": 0.0, "cell_accuracy": 0.0}, info={"error": extracted["error"]})
    actual = {(sheet, coord): value for sheet, coord, value in extracted["cells"]}
    missing = set(extracted.get("missing_sheets", []))
    matched, mismatches = 0, list[str]()
    for sheet, coord, value in expected.cells:
        key = (sheet, coord)
        if key in actual and book.same(value, actual[key]):
            matched += 1
        elif len(mismatches) < _SHOWN_MISMATCHES:
            got = "missing sheet" if sheet in missing else repr(actual.get(key))
            mismatches.append(f"{book.quote_sheet(sheet)}!{coord}: expected {value!r}, got {got}")
    total_cells = len(expected.cells)
    accuracy = matched / total_cells if total_cells else 0.0
    correct = float(total_cells > 0 and matched == total_cells)
    info: dict[str, Any] = {"cells": total_cells, "matched": matched, "recalculated": extracted.get("recalculated", 0)}
    if mismatches:
        info["mismatches"] = mismatches
    if missing:
        info["missing_sheets"] = sorted(missing)
    if extracted.get("engine_errors"):
        info["engine_errors"] = extracted["engine_errors"]
    total = (1.0 - partial_weight) * correct + partial_weight * accuracy
    return Reward(total=total, components={"correct": correct, "cell_accuracy": accuracy}, info=info)
