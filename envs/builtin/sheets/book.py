"""Workbook operations: references, value normalisation, read/write/describe, recalculation.

This module runs in two places, so it imports nothing but the standard library and openpyxl
(`formulas` lazily): in the worker on trusted files (the answer workbooks, the dataset's inputs)
and inside the sandbox on files the model controls, where its own source is the
program (`program(op, **args)` appends one call of `main`). A workbook the model wrote is never
parsed outside the sandbox, so a zip bomb or a formula that builds a huge array hits the sandbox's
limits, not the worker.

Design decisions:

* Values compare as SpreadsheetBench and benchmax compare them (`normalize`, `same`): numbers
  (booleans included) and numeric strings rounded to 2 decimals, times as ``HH:MM``, dates and
  datetimes as Excel serials rounded to the day, ``""`` equal to empty; otherwise types must match.
* Formulas count. openpyxl writes formulas without cached values, so a formula cell whose cached
  value is missing is recalculated with the `formulas` engine (only the cells asked for and their
  dependencies). An engine failure is the cell's value (``#ENGINE!``): it scores as a mismatch and
  is reported, it never raises.
* References accept what SpreadsheetBench's ``answer_position`` uses: several comma-separated
  areas, ``Sheet!A1:B9``, quoted names (``'My Sheet'!A1``, ``''`` for a quote), ``$`` markers and
  whole columns (``A:C``, bounded by the sheet's used rows).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULT_MARKER = "@@gymflow-book@@"
"""Prefix of the one stdout line that carries an operation's JSON result."""
ENGINE_ERROR = "#ENGINE!"
"""The value of a formula the recalculation engine could not evaluate."""
MAX_READ_CELLS = 400
"""Most cells one read returns."""
MAX_WRITE_CELLS = 2000
"""Most cells one write may set."""
_EPOCH = datetime.datetime(1899, 12, 30)
_CELL_RE = re.compile(r"^\$?([A-Za-z]{1,3})\$?([1-9][0-9]{0,6})$")
_COL_RE = re.compile(r"^\$?([A-Za-z]{1,3})$")
_MAX_COL = 16384


class BookError(ValueError):
    """A bad reference, a missing sheet, an unreadable workbook: the message says which."""


@dataclass(frozen=True)
class Area:
    """A rectangle of cells; `max_row` None means whole columns."""

    sheet: str | None
    min_col: int
    min_row: int
    max_col: int
    max_row: int | None

    def bounded(self, max_row: int) -> Area:
        """The area with whole columns cut at `max_row`."""
        return self if self.max_row is not None else Area(self.sheet, self.min_col, 1, self.max_col, max(max_row, 1))

    def coords(self) -> list[str]:
        """Cell names, row by row (whole columns must be bounded first)."""
        if self.max_row is None:
            raise BookError("whole-column areas must be bounded before listing cells")
        return [
            f"{column_letter(c)}{r}"
            for r in range(self.min_row, self.max_row + 1)
            for c in range(self.min_col, self.max_col + 1)
        ]

    @property
    def size(self) -> int:
        rows = (self.max_row or 1) - self.min_row + 1
        return rows * (self.max_col - self.min_col + 1)

    def ref(self) -> str:
        """``A1:B9`` (or ``A:B``) without the sheet."""
        first, last = column_letter(self.min_col), column_letter(self.max_col)
        if self.max_row is None:
            return f"{first}:{last}"
        start, end = f"{first}{self.min_row}", f"{last}{self.max_row}"
        return start if start == end else f"{start}:{end}"


def column_index(letters: str) -> int:
    """``A`` -> 1, ``AA`` -> 27."""
    value = 0
    for ch in letters.upper():
        value = value * 26 + ord(ch) - 64
    return value


def column_letter(index: int) -> str:
    """1 -> ``A``, 27 -> ``AA``."""
    letters = ""
    while index:
        index, rem = divmod(index - 1, 26)
        letters = chr(65 + rem) + letters
    return letters


def quote_sheet(sheet: str) -> str:
    """A sheet name as a reference needs it: quoted unless it is plain letters, digits and ``_``."""
    return sheet if sheet.replace("_", "").isalnum() else "'" + sheet.replace("'", "''") + "'"


def split_areas(text: str) -> list[str]:
    """Split on commas that are not inside a quoted sheet name."""
    parts, current, quoted = [], "", False
    for ch in text:
        if ch == "'":
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(current)
            current = ""
        else:
            current += ch
    if quoted:
        raise BookError(f"unbalanced quote in {text!r}")
    return [*parts, current]


def parse_area(text: str) -> Area:
    """One area: ``A1``, ``A1:B9``, ``A:C``, optionally ``Sheet!`` or ``'My Sheet'!`` first."""
    text = text.strip()
    sheet: str | None = None
    if text.startswith("'"):
        quoted = re.match(r"'((?:[^']|'')+)'!", text)
        if quoted is None:
            raise BookError(f"bad quoted sheet name in {text!r}")
        sheet, text = quoted.group(1).replace("''", "'"), text[quoted.end() :]
    elif "!" in text:
        sheet, _, text = text.rpartition("!")
        if not sheet:
            raise BookError("empty sheet name before '!'")
    start, colon, end = text.partition(":")
    if colon and not (start and end):
        raise BookError(f"incomplete range {text!r}")
    end = end or start
    cells = _CELL_RE.match(start), _CELL_RE.match(end)
    if cells[0] and cells[1]:
        cols = sorted((column_index(cells[0].group(1)), column_index(cells[1].group(1))))
        rows = sorted((int(cells[0].group(2)), int(cells[1].group(2))))
        area = Area(sheet, cols[0], rows[0], cols[1], rows[1])
    elif ":" in text and _COL_RE.match(start) and _COL_RE.match(end):
        cols = sorted((column_index(start.strip("$")), column_index(end.strip("$"))))
        area = Area(sheet, cols[0], 1, cols[1], None)
    else:
        raise BookError(f"not a cell or range: {text!r}")
    if area.max_col > _MAX_COL:
        raise BookError(f"column out of range in {text!r}")
    return area


def parse_position(text: str) -> list[Area]:
    """Every area of an ``answer_position`` such as ``'My Sheet'!A1:B9,Other!C3``."""
    if not isinstance(text, str) or not text.strip():
        raise BookError("answer_position is empty")
    try:
        return [parse_area(part) for part in split_areas(text)]
    except BookError as exc:
        raise BookError(f"bad answer_position {text!r}: {exc}") from None


def normalize(value: Any) -> Any:
    """A cell value as SpreadsheetBench compares it (JSON-serialisable)."""
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()  # numpy scalars from the formula engine
    if value is None:
        return None
    if isinstance(value, bool | int | float):
        number = float(value)
        return round(number, 2) if math.isfinite(number) else str(number)
    if isinstance(value, datetime.datetime):
        delta = value.replace(tzinfo=None) - _EPOCH
        return float(round(delta.days + delta.seconds / 86400.0, 0))
    if isinstance(value, datetime.date):
        return normalize(datetime.datetime(value.year, value.month, value.day))
    if isinstance(value, datetime.time):
        return str(value)[:-3]
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return round(number, 2) if math.isfinite(number) else value
    return str(value)


def same(expected: Any, actual: Any) -> bool:
    """Whether two normalised values match: ``""`` equals empty, otherwise type and value."""
    if expected in ("", None) and actual in ("", None):
        return True
    return type(expected) is type(actual) and expected == actual


# -- workbooks ---------------------------------------------------------------------------------
def load(path: str | Path, *, data_only: bool = False, read_only: bool = False) -> Any:
    """Open a workbook, turning every way a file can be broken into a BookError."""
    import openpyxl

    name = Path(path).name
    if not Path(path).is_file():
        raise BookError(f"no file {name!r}")
    try:
        return openpyxl.load_workbook(path, data_only=data_only, read_only=read_only)
    except Exception as exc:  # zipfile, XML and openpyxl errors alike mean "not a workbook"
        raise BookError(f"{name!r} is not a valid .xlsx workbook ({type(exc).__name__}: {exc})") from None


def sheet_of(book: Any, name: str | None) -> Any:
    """The named sheet (the first one for None), or a BookError listing the sheets."""
    if name is None:
        return book.worksheets[0]
    if name not in book.sheetnames:
        raise BookError(f"no sheet {name!r}; sheets: {', '.join(repr(s) for s in book.sheetnames)}")
    return book[name]


def formula_text(value: Any) -> str | None:
    """The formula of a cell value in formula mode, or None."""
    if isinstance(value, str):
        return value if value.startswith("=") and len(value) > 1 else None
    text = getattr(value, "text", None)  # ArrayFormula
    return text if isinstance(text, str) else None


def extract(path: str | Path, areas: list[list[Any]]) -> dict[str, Any]:
    """Normalised values of cells, recalculating formulas that have no cached value.

    Args:
        path: The workbook.
        areas: ``[sheet, "A1:B9"]`` pairs with explicit bounds.

    Returns:
        ``{"cells": [[sheet, coord, value], ...], "missing_sheets": [...], "recalculated": n,
        "engine_errors": [...]}``; cells of a missing sheet are left out.
    """
    formulas_book, values_book = load(path), load(path, data_only=True)
    cells: list[list[Any]] = []
    missing: list[str] = []
    pending: dict[tuple[str, str], int] = {}
    for sheet_name, ref in areas:
        if sheet_name not in values_book.sheetnames:
            missing.append(sheet_name)
            continue
        fsheet, vsheet = formulas_book[sheet_name], values_book[sheet_name]
        for coord in parse_area(ref).coords():
            raw, cached = fsheet[coord].value, vsheet[coord].value
            if formula_text(raw) is not None and cached is None:
                pending[(sheet_name, coord)] = len(cells)
            cells.append([sheet_name, coord, normalize(cached)])
    errors: list[str] = []
    if pending:
        for key, value in _recalculate(Path(path), list(pending), errors).items():
            cells[pending[key]][2] = normalize(value)
    return {"cells": cells, "missing_sheets": missing, "recalculated": len(pending), "engine_errors": errors[:20]}


def _recalculate(path: Path, wanted: list[tuple[str, str]], errors: list[str]) -> dict[tuple[str, str], Any]:
    """Values of formula cells from the `formulas` engine (the cells and their dependencies only)."""
    os.environ.setdefault("TQDM_DISABLE", "1")  # the engine draws progress bars on stderr otherwise
    try:
        import formulas

        model = formulas.ExcelModel().loads(str(path)).finish()
        names: dict[tuple[str, str], str] = {}
        for name in model.cells:
            match = re.match(r"^'\[[^\]]*\](.+)'!([A-Z]+\d+)$", name)
            if match:
                names[(match.group(1).replace("''", "'").upper(), match.group(2))] = name
        keys = {cell: names[(cell[0].upper(), cell[1])] for cell in wanted if (cell[0].upper(), cell[1]) in names}
        solution = model.calculate(outputs=list(keys.values()))
    except Exception as exc:  # an engine that cannot load the book fails every formula cell
        errors.append(f"formula engine failed on the workbook: {type(exc).__name__}: {exc}"[:300])
        return dict.fromkeys(wanted, ENGINE_ERROR)
    result: dict[tuple[str, str], Any] = {}
    for cell in wanted:
        node = solution.get(keys.get(cell, ""))
        value = getattr(node, "value", node)
        if value is None:
            errors.append(f"{cell[0]}!{cell[1]}: the engine produced no value")
            result[cell] = ENGINE_ERROR
            continue
        ndim: Any = getattr(value, "ndim", 0)
        while ndim:  # a (1, 1) array from the engine: its one element
            value = value.flat[0] if value.size else None
            ndim = getattr(value, "ndim", 0)
        if type(value).__name__ == "XlError":
            value = str(value)
        result[cell] = value
    return result


def _render(value: Any) -> str:
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _style(cell: Any) -> list[str]:
    style = []
    font, fill = cell.font, cell.fill
    if font is not None and font.bold:
        style.append("bold")
    if font is not None and font.italic:
        style.append("italic")
    color = getattr(getattr(font, "color", None), "rgb", None)
    if isinstance(color, str) and color not in ("FF000000", "00000000"):
        style.append(f"font {color}")
    fg = getattr(getattr(fill, "fgColor", None), "rgb", None)
    if getattr(fill, "fill_type", None) and isinstance(fg, str) and fg not in ("00000000", "FFFFFFFF"):
        style.append(f"fill {fg}")
    if cell.number_format and cell.number_format != "General":
        style.append(f"format {cell.number_format}")
    return style


def read_range(
    path: str, ref: str, *, sheet: str | None = None, formulas: bool = True, styles: bool = False
) -> dict[str, Any]:
    """Cells of one area as text lines (values, formulas with their cached values, styles)."""
    area = parse_area(ref)
    formulas_book, values_book = load(path), load(path, data_only=True)
    name = area.sheet if area.sheet is not None else sheet
    fsheet, vsheet = sheet_of(formulas_book, name), sheet_of(values_book, name)
    area = area.bounded(fsheet.max_row)
    coords = area.coords() if area.size <= MAX_READ_CELLS * 4 else None
    lines, shown, empty = [], 0, 0
    for coord in coords if coords is not None else area.bounded(area.min_row).coords():
        if shown >= MAX_READ_CELLS:
            break
        fcell, value = fsheet[coord], vsheet[coord].value
        formula = formula_text(fcell.value) if formulas else None
        style = _style(fcell) if styles else []
        if value is None and formula is None and not style:
            empty += 1
            continue
        shown += 1
        text = f"{coord} = {_render(value)}" if formula is None else f"{coord} = {formula}  (cached: {_render(value)})"
        lines.append(text + (f"  [{', '.join(style)}]" if style else ""))
    header = f"sheet {fsheet.title!r}, {area.ref()} (sheet size {fsheet.dimensions})"
    if shown >= MAX_READ_CELLS or coords is None:
        header += f"; output capped at {MAX_READ_CELLS} cells, read a smaller range for the rest"
    if empty:
        header += f"; {empty} empty cells omitted"
    return {"text": "\n".join([header, *lines])}


def write_cells(
    path: str, cells: dict[str, Any], *, sheet: str | None = None, source: str | None = None, create: bool = False
) -> dict[str, Any]:
    """Set cells (a string starting with ``=`` is a formula) of `path`, saving it.

    When `path` does not exist yet it starts as a copy of `source`; `create` adds a missing sheet.
    """
    if not str(path).lower().endswith((".xlsx", ".xlsm")):
        raise BookError(f"the workbook to write must end in .xlsx, got {path!r}")
    if len(cells) > MAX_WRITE_CELLS:
        raise BookError(f"at most {MAX_WRITE_CELLS} cells per write, got {len(cells)}")
    book = load(path if Path(path).is_file() or source is None else source)
    if create and sheet is not None and sheet not in book.sheetnames:
        book.create_sheet(sheet)
    target = sheet_of(book, sheet) if sheet is not None else book.active
    for coord, value in cells.items():
        if not _CELL_RE.match(coord):
            raise BookError(f"not a cell name: {coord!r} (one cell per key, like 'B2')")
        if value is not None and not isinstance(value, str | int | float | bool):
            raise BookError(f"cell {coord}: values must be text, numbers, booleans or null")
        target[coord.replace("$", "")] = value
    book.save(path)
    return {"text": f"wrote {len(cells)} cells to sheet {target.title!r} of {path}"}


def describe(path: str) -> dict[str, Any]:
    """Sheet names and used ranges."""
    book = load(path)
    lines = [f"{Path(path).name}: {len(book.sheetnames)} sheets"]
    for ws in book.worksheets:
        lines.append(f"- {ws.title!r}: used range {ws.dimensions} ({ws.max_row} rows x {ws.max_column} columns)")
    return {"text": "\n".join(lines)}


_OPS: dict[str, Callable[..., dict[str, Any]]] = {
    "extract": extract,
    "read": read_range,
    "write": write_cells,
    "describe": describe,
}


def main(request: dict[str, Any]) -> None:
    """Run one operation and print its JSON result after `RESULT_MARKER` (sandbox entry point)."""
    try:
        op = _OPS[request.pop("op")]
        result: dict[str, Any] = {"ok": True, **op(**request)}
    except BookError as exc:
        result = {"ok": False, "error": str(exc)}
    except Exception as exc:  # anything else the file does to openpyxl is still the file's problem
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(RESULT_MARKER + json.dumps(result, default=str) + "\n")


def program(op: str, **args: Any) -> str:
    """The source of a sandbox program that runs `op` with `args` (this module plus one call)."""
    return Path(__file__).read_text() + f"\n\nmain(json.loads({json.dumps(json.dumps({'op': op, **args}))}))\n"


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The result a `program` printed, or None if it printed none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            parsed = json.loads(line[len(RESULT_MARKER) :])
            return parsed if isinstance(parsed, dict) else None
    return None
