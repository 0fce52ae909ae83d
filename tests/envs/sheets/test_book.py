"""Workbook operations: references, SpreadsheetBench normalisation, recalculated formulas, bounded reads."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import openpyxl
import pytest

from gymflow.envs.builtin.sheets import book, data
from gymflow.envs.builtin.sheets.book import Area, BookError, normalize, parse_position, same


def test_answer_positions() -> None:
    assert parse_position("H3:H5") == [Area(None, 8, 3, 8, 5)]
    assert parse_position("'My ''Q1'' Sheet'!$B$2:A1,Other!C3") == [
        Area("My 'Q1' Sheet", 1, 1, 2, 2),
        Area("Other", 3, 3, 3, 3),
    ]
    assert parse_position("'a,b'!A:C, 'Sales Data'!AA10") == [
        Area("a,b", 1, 1, 3, None),
        Area("Sales Data", 27, 10, 27, 10),
    ]
    assert Area("S", 1, 1, 3, None).bounded(4).coords()[-1] == "C4"
    assert book.quote_sheet("Sales Data") == "'Sales Data'" and book.quote_sheet("Sheet_1") == "Sheet_1"
    for bad in ["", "A0", "Sheet!", "!A1", "'Open!A1", "A1:B", "A1:", ":B2", "ZZZZ1", "hello"]:
        with pytest.raises(BookError, match="answer_position"):
            parse_position(bad)


def test_normalisation_matches_spreadsheetbench() -> None:
    assert normalize(3) == normalize(3.0) == normalize("3") == normalize("3.000") == 3.0
    assert normalize(2.71828) == 2.72 and normalize("1e3") == 1000.0
    assert normalize(True) == 1.0
    assert normalize(datetime.datetime(2024, 1, 5)) == normalize(datetime.date(2024, 1, 5)) == 45296.0
    assert normalize(datetime.time(9, 30)) == "09:30"
    assert normalize("North") == "North" and normalize("nan") == "nan"
    assert same(None, "") and same("", None) and same(None, None)
    assert same(45296.0, normalize(45296)) and not same("45296x", 45296.0)
    assert not same(1.0, "1.0x") and not same(0.0, None)


def _workbook(path: Path, cells: dict[str, object], *, title: str = "Data") -> Path:
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = title
    for row in range(2, 11):
        ws[f"A{row}"], ws[f"B{row}"] = f"item{row}", row * 1.5
    for coord, value in cells.items():
        ws[coord] = value
    wb.save(path)
    return path


def test_a_formula_written_by_openpyxl_is_recalculated(tmp_path: Path) -> None:
    path = _workbook(
        tmp_path / "out.xlsx",
        {"C1": "=SUM(B2:B10)", "C2": "=C1*2", "C3": '=VLOOKUP("item4",A2:B10,2,FALSE)', "C4": "=1/0", "C5": 81},
    )
    assert openpyxl.load_workbook(path, data_only=True)["Data"]["C1"].value is None  # no cached value
    result = book.extract(path, [["Data", "C1:C5"]])
    assert result["cells"] == [
        ["Data", "C1", 81.0],
        ["Data", "C2", 162.0],
        ["Data", "C3", 6.0],
        ["Data", "C4", "#DIV/0!"],
        ["Data", "C5", 81.0],
    ]
    assert result["recalculated"] == 4 and result["engine_errors"] == []
    assert book.extract(path, [["Missing", "A1"]])["missing_sheets"] == ["Missing"]


def test_read_write_describe(tmp_path: Path) -> None:
    source = _workbook(tmp_path / "input.xlsx", {"B2": "=SUM(B3:B10)"})
    out = str(tmp_path / "output.xlsx")
    written = book.write_cells(out, {"D2": 7, "D3": "=D2+1", "D4": None}, source=str(source))
    assert "3 cells" in written["text"]
    text = book.read_range(out, "B2:D3", styles=True)["text"]
    assert "B2 = =SUM(B3:B10)  (cached: None)" in text and "D3 = =D2+1" in text
    assert "B3 = 4.5" in text and 'A2 = "item2"' not in text  # outside the range
    assert "Data" in book.describe(out)["text"]
    assert book.write_cells(out, {"A1": "x"}, sheet="New", create=True)["text"].endswith("output.xlsx")
    with pytest.raises(BookError, match="no sheet 'Nope'; sheets: 'Data', 'New'"):
        book.read_range(out, "Nope!A1")
    with pytest.raises(BookError, match="not a cell name"):
        book.write_cells(out, {"A1:B2": 1})
    with pytest.raises(BookError, match=r"must end in \.xlsx"):
        book.write_cells(str(tmp_path / "x.csv"), {"A1": 1}, source=str(source))


def test_reads_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "big.xlsx"
    wb = openpyxl.Workbook()
    for _ in range(300):
        wb.active.append(list(range(10)))
    wb.save(path)
    text = book.read_range(str(path), "A1:J300")["text"]
    assert text.count("\n") == book.MAX_READ_CELLS and "capped" in text
    preview = data.preview(str(path))
    assert "300 rows x 10 columns" in preview and "292 more rows, 2 more columns" in preview
    assert len(preview) < 1000


def test_broken_files_are_book_errors(tmp_path: Path) -> None:
    (tmp_path / "junk.xlsx").write_bytes(b"PK\x03\x04 definitely not a workbook")
    for call in (
        lambda: book.describe(str(tmp_path / "junk.xlsx")),
        lambda: book.describe(str(tmp_path / "none.xlsx")),
    ):
        with pytest.raises(BookError, match=r"not a valid \.xlsx workbook|no file"):
            call()


def test_program_runs_an_operation_as_a_script(tmp_path: Path) -> None:
    path = _workbook(tmp_path / "in.xlsx", {"C1": "=B2+B3"})
    code = book.program("extract", path=str(path), areas=[["Data", "C1"]])
    done = subprocess.run(
        [sys.executable, "-I", "-"], check=False, input=code, capture_output=True, text=True, timeout=120
    )
    assert book.parse_result(done.stdout) == {
        "ok": True,
        "cells": [["Data", "C1", 7.5]],
        "missing_sheets": [],
        "recalculated": 1,
        "engine_errors": [],
    }
    bad = book.program("read", path=str(path), ref="Z!A1")
    done = subprocess.run(
        [sys.executable, "-I", "-"], check=False, input=bad, capture_output=True, text=True, timeout=120
    )
    assert json.dumps(book.parse_result(done.stdout)) == json.dumps(
        {"ok": False, "error": "no sheet 'Z'; sheets: 'Data'"}
    )
