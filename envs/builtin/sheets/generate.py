"""A seeded procedural generator of spreadsheet tasks, written in SpreadsheetBench's own format.

``write_dataset(root, n, seed)`` produces what SpreadsheetBench ships: ``dataset.json`` (rows with
id, instruction, instruction_type, answer_position, spreadsheet_path) and, per row,
``spreadsheet/ID/1_ID_input.xlsx`` and ``1_ID_answer.xlsx``. The env loads it with the same loader
as the real benchmark, so the offline data exercises the real path.

Design decisions:

* Task ``index`` of ``seed`` depends on nothing else: its generator is seeded from
  ``(VERSION, seed, index)`` and its family is ``FAMILIES[(seed + index) % len]``. So anyone with
  the code can rebuild a task from its id (``g1-s0-00017``): the reference policy does exactly
  that to obtain the reference program, and a worker without the client's files rebuilds the
  input workbook (`input_workbook`, in memory). Nobody needs the answer files for either, so
  they are written only on request (``write_dataset(answers=True)``): a worker's disk never holds
  the answers of generated tasks, whatever its sandbox.
* The cache directory name carries a fingerprint of the generator's source, so files written by
  an older generator are never mistaken for the current one.
* Files are written aside and renamed into place, so concurrent generators
  (two workers, a worker and a client) never see half a task. The cache is created 0700: at the
  weaker sandbox levels, a sandboxed program (its own uid) still cannot read the answers.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import io
import json
import os
import random
import re
import threading
from pathlib import Path
from typing import Any

from gymflow.envs.builtin.sheets.families import FAMILIES, Spec

VERSION = 1
"""Bump to change every generated task id; source changes alone change the cache fingerprint."""
CACHE_ENV = "GYMFLOW_SHEETS_CACHE"
"""Overrides the cache directory (default ``$XDG_CACHE_HOME/gymflow/sheets``)."""
_ROW_ID_RE = re.compile(rf"^g{VERSION}-s(\d+)-(\d+)$")
_MAX_DRAWS = 200


def row_id(seed: int, index: int) -> str:
    """The dataset id of generated task `index` of `seed`."""
    return f"g{VERSION}-s{seed}-{index:05d}"


def parse_row_id(text: str) -> tuple[int, int] | None:
    """``(seed, index)`` of a generated row id of this VERSION, else None."""
    match = _ROW_ID_RE.match(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


@functools.lru_cache(maxsize=4096)
def spec(seed: int, index: int) -> Spec:
    """Generated task `index` of `seed` (pure: no files)."""
    names = list(FAMILIES)
    family = FAMILIES[names[(seed + index) % len(names)]]
    rng = random.Random(f"sheets-v{VERSION}-{seed}-{index}")
    formula = rng.random() < 0.5
    for _ in range(_MAX_DRAWS):
        drawn = family(rng, formula)
        if drawn is not None:
            return drawn
    raise RuntimeError(f"family {names[(seed + index) % len(names)]} drew no usable data in {_MAX_DRAWS} tries")


@functools.cache
def fingerprint() -> str:
    """A digest of the generator's source: part of the cache path."""
    digest = hashlib.sha256()
    for module in ("generate.py", "families.py"):
        digest.update((Path(__file__).parent / module).read_bytes())
    return digest.hexdigest()[:12]


def cache_root() -> Path:
    """Where generated datasets live (never inside the repo, never in a workspace)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gymflow" / "sheets"


def dataset_dir(seed: int, *, root: Path | None = None) -> Path:
    """The directory of the generated dataset of `seed` for this generator version."""
    return (root or cache_root()) / f"gen-v{VERSION}-{fingerprint()}-s{seed}"


def workbook(sheets: dict[str, list[list[Any]]], *cells: dict[str, dict[str, Any]]) -> Any:
    """An openpyxl workbook with `sheets` (rows) and then `cells` (sheet -> coord -> value) set."""
    import openpyxl

    book = openpyxl.Workbook()
    book.remove(book.active)
    for name, rows in sheets.items():
        ws = book.create_sheet(name)
        for row in rows:
            ws.append(row)
    for mapping in cells:
        for name, values in mapping.items():
            ws = book[name] if name in book.sheetnames else book.create_sheet(name)
            for coord, value in values.items():
                ws[coord] = value
    for ws in book.worksheets:
        for row in ws.iter_rows():
            for cell in row:
                if isinstance(cell.value, datetime.datetime):
                    cell.number_format = "yyyy-mm-dd"
    return book


def dataset_row(seed: int, index: int) -> dict[str, Any]:
    """The dataset.json row of a generated task (SpreadsheetBench fields plus `generator`)."""
    drawn = spec(seed, index)
    rid = row_id(seed, index)
    return {
        "id": rid,
        "instruction": drawn.instruction,
        "instruction_type": drawn.instruction_type,
        "answer_position": drawn.answer_position,
        "spreadsheet_path": f"spreadsheet/{rid}",
        "generator": {"version": VERSION, "fingerprint": fingerprint(), "seed": seed, "index": index},
        "family": drawn.family,
        "formula_answer": drawn.formula,
    }


def input_workbook(seed: int, index: int) -> bytes:
    """Task `index`'s input workbook, built in memory (a worker rebuilding an input writes no answer)."""
    drawn = spec(seed, index)
    out = io.BytesIO()
    workbook(drawn.sheets, drawn.extras).save(out)
    return out.getvalue()


def ensure_row(directory: Path, seed: int, index: int, *, answer: bool = False) -> Path:
    """Write task `index`'s input workbook (and its answer, if asked) under `directory` unless present."""
    rid = row_id(seed, index)
    final = directory / "spreadsheet" / rid
    names = [f"1_{rid}_input.xlsx", *([f"1_{rid}_answer.xlsx"] if answer else [])]
    if all((final / name).is_file() for name in names):
        return final
    drawn = spec(seed, index)
    final.mkdir(parents=True, exist_ok=True)
    for name in names:  # each file written aside and renamed in: concurrent writers never see half of one
        if not (final / name).is_file():
            extra = [drawn.answer] if name.endswith("_answer.xlsx") else []
            tmp = final / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                workbook(drawn.sheets, drawn.extras, *extra).save(tmp)
                tmp.replace(final / name)
            finally:
                tmp.unlink(missing_ok=True)
    return final


def write_dataset(n: int, *, seed: int = 0, root: Path | None = None, answers: bool = False) -> Path:
    """Generate tasks 0..n-1 of `seed` in SpreadsheetBench layout (reusing cached ones); the directory.

    Args:
        n: Tasks to write.
        seed: The dataset's seed.
        root: Cache root (default `cache_root()`).
        answers: Also write each task's answer workbook (the benchmark's full format, for use
            elsewhere). The env never needs them: generated tasks carry their expected cells.
    """
    directory = dataset_dir(seed, root=root)
    directory.mkdir(parents=True, exist_ok=True)
    for parent in (directory.parent, directory):
        parent.chmod(0o700)
    rows = [dataset_row(seed, i) for i in range(n)]
    for i in range(n):
        ensure_row(directory, seed, i, answer=answers)
    manifest = directory / "dataset.json"
    existing = json.loads(manifest.read_text()) if manifest.is_file() else []
    if len(existing) < n:
        tmp = manifest.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(manifest)
    return directory
