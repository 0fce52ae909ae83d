"""Task families of the spreadsheet generator: each draws data, an instruction, the answer and a reference program.

Every family returns a `Spec`, or None when the drawn data is ambiguous (a value that sits on a
rounding boundary, where Excel's and Python's arithmetic could round differently) and must be
redrawn. The answer is computed here in plain Python from the drawn data; the reference program
is separate code that reads ``input.xlsx`` with openpyxl and writes ``output.xlsx``, so "the
reference scores 1.0" checks two independent computations against each other, through the
sandbox and the formula engine. Families with ``formula=True`` make the reference write Excel
formulas (``=SUMIF(...)``, ``=VLOOKUP(...)``, chains like ``=C2*D2`` over a looked-up ``D2``),
which only score through recalculation.
"""

from __future__ import annotations

import datetime
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gymflow.envs.builtin.sheets.book import quote_sheet as quote

CELL_LEVEL = "Cell-Level Manipulation"
SHEET_LEVEL = "Sheet-Level Manipulation"

REGIONS = ["North", "South", "East", "West", "Central", "Coastal"]
PEOPLE = ["Ana", "Ben", "Chloe", "Dev", "Elif", "Femi", "Goran", "Hana", "Ivo", "Jun", "Kai", "Lena", "Milo", "Nia"]
SURNAMES = ["Ito", "Novak", "Okafor", "Silva", "Berg", "Khan", "Moreau", "Quinn", "Rossi", "Tanaka", "Weber", "Young"]
CITIES = ["Lisbon", "Nairobi", "Osaka", "Denver", "Krakow", "Austin", "Bergen", "Cairo", "Dublin", "Porto", "Quito"]
PRODUCTS = ["Stapler", "Notebook", "Marker", "Monitor", "Desk Lamp", "Cable", "Headset", "Mouse", "Chair", "Webcam"]
CATEGORIES = ["Rent", "Travel", "Software", "Hardware", "Catering", "Training", "Utilities"]
DEPARTMENTS = ["Sales", "Finance", "Legal", "Research", "Support", "Operations", "Marketing"]

HEAD = 'import openpyxl\n\nwb = openpyxl.load_workbook("input.xlsx")\n'
TAIL = 'wb.save("output.xlsx")\n'


@dataclass
class Spec:
    """One generated task, before it becomes files and a `Task`."""

    family: str
    instruction: str
    instruction_type: str
    sheets: dict[str, list[list[Any]]]
    """Input workbook: sheet name -> rows (row 1 first), in sheet order."""
    answer: dict[str, dict[str, Any]]
    """Cells the answer workbook sets: sheet -> coordinate -> value (new sheets included)."""
    answer_position: str
    program: str
    """Reference solution: Python with openpyxl, input.xlsx -> output.xlsx."""
    formula: bool = False
    """Whether the reference writes formulas rather than values."""
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Additional input cells (labels): sheet -> coordinate -> value."""


def cents(rng: random.Random, low: int, high: int) -> float:
    """A money amount with two decimals."""
    return rng.randint(low * 100, high * 100) / 100


def safe(value: float, digits: int = 2) -> bool:
    """False when `value` lies (almost) on a rounding boundary at `digits` decimals."""
    scaled = abs(value) * 10**digits
    return abs(scaled % 1 - 0.5) > 1e-6


def _column(values: list[Any], col: str, first_row: int = 2) -> dict[str, Any]:
    return {f"{col}{first_row + i}": v for i, v in enumerate(values)}


def aggregate(rng: random.Random, formula: bool) -> Spec | None:
    sheet = rng.choice(["Sales Data", "Sales", "Q3 Orders"])
    regions = rng.sample(REGIONS, 4)
    n = rng.randint(12, 40)
    data: list[list[Any]] = [
        [rng.choice(regions), rng.choice(PEOPLE), cents(rng, 20, 900), rng.randint(1, 30)] for _ in range(n)
    ]
    target = rng.choice(sorted({row[0] for row in data}))
    stat, (name, idx) = rng.choice(["total", "average", "largest"]), rng.choice([("Amount", 2), ("Units", 3)])
    values = [row[idx] for row in data if row[0] == target]
    reducers: dict[str, Callable[[list[Any]], Any]] = {"total": sum, "average": statistics.fmean, "largest": max}
    result = reducers[stat](values)
    if not safe(result):
        return None
    col, last = "CD"[idx - 2], n + 1
    if formula:
        crit = f'A2:A{last},"{target}"'
        first = {
            "total": f"=SUMIF({crit},{col}2:{col}{last})",
            "average": f"=AVERAGEIF({crit},{col}2:{col}{last})",
            "largest": f"=MAXIFS({col}2:{col}{last},{crit})",
        }[stat]
        body = f"ws['G2'] = {first!r}\nws['G3'] = {f'=COUNTIF({crit})'!r}\n"
    else:
        expr = {"total": "sum(values)", "average": "sum(values) / len(values)", "largest": "max(values)"}[stat]
        body = (
            f"values = [ws.cell(r, {idx + 1}).value for r in range(2, ws.max_row + 1)"
            f" if ws.cell(r, 1).value == {target!r}]\nws['G2'] = {expr}\nws['G3'] = len(values)\n"
        )
    return Spec(
        family="aggregate",
        instruction=(
            f"In sheet '{sheet}', put in cell G2 the {stat} {name} of the rows whose Region is {target!r}, "
            f"and in cell G3 the number of those rows."
        ),
        instruction_type=CELL_LEVEL,
        sheets={sheet: [["Region", "Rep", "Amount", "Units"], *data]},
        extras={sheet: {"F2": f"{stat.title()} {name} ({target})", "F3": f"Rows ({target})"}},
        answer={sheet: {"G2": result, "G3": len(values)}},
        answer_position=f"{quote(sheet)}!G2:G3",
        program=HEAD + f"ws = wb[{sheet!r}]\n" + body + TAIL,
        formula=formula,
    )


def lookup(rng: random.Random, formula: bool) -> Spec | None:
    k, n = rng.randint(4, 8), rng.randint(8, 25)
    codes = [f"P{c}" for c in rng.sample(range(100, 999), k)]
    prices = {code: cents(rng, 1, 250) for code in codes}
    catalog = [[code, name, prices[code]] for code, name in zip(codes, rng.sample(PRODUCTS, k), strict=True)]
    orders: list[list[Any]] = [[1000 + i, rng.choice(codes), rng.randint(1, 12)] for i in range(n)]
    totals = [qty * prices[code] for _, code, qty in orders]
    if not all(safe(t) for t in totals):
        return None
    if formula:
        body = (
            "for r in range(2, ws.max_row + 1):\n"
            f"    ws[f'D{{r}}'] = f\"=VLOOKUP(B{{r}},'Price List'!$A$2:$C${k + 1},3,FALSE)\"\n"
            "    ws[f'E{r}'] = f'=C{r}*D{r}'\n"
        )
    else:
        body = (
            "prices = {row[0]: row[2] for row in wb['Price List'].iter_rows(min_row=2, values_only=True)}\n"
            "for r in range(2, ws.max_row + 1):\n"
            "    ws.cell(r, 4).value = prices[ws.cell(r, 2).value]\n"
            "    ws.cell(r, 5).value = ws.cell(r, 3).value * ws.cell(r, 4).value\n"
        )
    return Spec(
        family="lookup",
        instruction=(
            f"In sheet 'Orders', fill D2:D{n + 1} (Unit Price) with the price of each order's product code "
            f"from sheet 'Price List', and E2:E{n + 1} (Total) with Qty times Unit Price."
        ),
        instruction_type=CELL_LEVEL,
        sheets={
            "Orders": [["Order", "Code", "Qty", "Unit Price", "Total"], *orders],
            "Price List": [["Code", "Product", "Price"], *catalog],
        },
        answer={"Orders": _column([prices[c] for _, c, _ in orders], "D") | _column(totals, "E")},
        answer_position=f"Orders!D2:E{n + 1}",
        program=HEAD + "ws = wb['Orders']\n" + body + TAIL,
        formula=formula,
    )


def grades(rng: random.Random, formula: bool) -> Spec | None:
    sheet = rng.choice(["Scores", "Exam Results"])
    high, low = rng.choice([(90, 75), (85, 70), (80, 60)])
    n = rng.randint(8, 30)
    data: list[list[Any]] = [[f"{rng.choice(PEOPLE)} {rng.choice(SURNAMES)}", rng.randint(35, 100)] for _ in range(n)]
    grade = ["A" if s >= high else "B" if s >= low else "C" for _, s in data]
    if formula:
        body = (
            "for r in range(2, ws.max_row + 1):\n"
            f'    ws[f\'C{{r}}\'] = f\'=IF(B{{r}}>={high},"A",IF(B{{r}}>={low},"B","C"))\'\n'
        )
    else:
        body = (
            "for r in range(2, ws.max_row + 1):\n"
            "    score = ws.cell(r, 2).value\n"
            f"    ws.cell(r, 3).value = 'A' if score >= {high} else 'B' if score >= {low} else 'C'\n"
        )
    return Spec(
        family="grades",
        instruction=(
            f"In sheet '{sheet}', fill column C (Grade) for rows 2-{n + 1}: \"A\" when the Score is at least "
            f'{high}, "B" when it is at least {low}, otherwise "C".'
        ),
        instruction_type=CELL_LEVEL,
        sheets={sheet: [["Student", "Score", "Grade"], *data]},
        answer={sheet: _column(grade, "C")},
        answer_position=f"{quote(sheet)}!C2:C{n + 1}",
        program=HEAD + f"ws = wb[{sheet!r}]\n" + body + TAIL,
        formula=formula,
    )


def dates(rng: random.Random, formula: bool) -> Spec | None:
    sheet = rng.choice(["Tasks", "Project Plan"])
    n = rng.randint(6, 20)
    starts = [datetime.datetime(2024, 1, 1) + datetime.timedelta(days=rng.randint(0, 500)) for _ in range(n)]
    data: list[list[Any]] = [[f"Task {i + 1}", start, rng.randint(1, 90)] for i, start in enumerate(starts)]
    due: list[datetime.datetime] = [start + datetime.timedelta(days=days) for _, start, days in data]
    if formula:
        body = (
            "for r in range(2, ws.max_row + 1):\n    ws[f'D{r}'] = f'=B{r}+C{r}'\n    ws[f'E{r}'] = f'=MONTH(D{r})'\n"
        )
    else:
        body = (
            "import datetime\n\nfor r in range(2, ws.max_row + 1):\n"
            "    due = ws.cell(r, 2).value + datetime.timedelta(days=ws.cell(r, 3).value)\n"
            "    ws.cell(r, 4).value = due\n    ws.cell(r, 4).number_format = 'yyyy-mm-dd'\n"
            "    ws.cell(r, 5).value = due.month\n"
        )
    return Spec(
        family="dates",
        instruction=(
            f"In sheet '{sheet}', fill D2:D{n + 1} (Due) with the Start date plus Days, and E2:E{n + 1} (Month) "
            "with the month number (1-12) of the due date."
        ),
        instruction_type=CELL_LEVEL,
        sheets={sheet: [["Task", "Start", "Days", "Due", "Month"], *data]},
        answer={sheet: _column(due, "D") | _column([d.month for d in due], "E")},
        answer_position=f"{quote(sheet)}!D2:E{n + 1}",
        program=HEAD + f"ws = wb[{sheet!r}]\n" + body + TAIL,
        formula=formula,
    )


def low_stock(rng: random.Random, formula: bool) -> Spec | None:
    del formula  # a filtered copy is values by nature
    n, threshold = rng.randint(10, 30), rng.choice([10, 15, 20, 25])
    items: list[list[Any]] = [
        [
            f"{rng.choice(PRODUCTS)} {chr(65 + i % 26)}{i}",
            rng.choice(CATEGORIES),
            rng.randint(0, 60),
            cents(rng, 2, 400),
        ]
        for i in range(n)
    ]
    kept = [row for row in items if row[2] < threshold]
    if not 2 <= len(kept) <= n - 2:
        return None
    header = ["Item", "Category", "Stock", "Price"]
    answer = {f"{c}{r + 1}": v for r, row in enumerate([header, *kept]) for c, v in zip("ABCD", row, strict=True)}
    body = (
        "src = wb['Inventory']\nout = wb.create_sheet('Low Stock')\n"
        "out.append([c.value for c in src[1]])\n"
        "for row in src.iter_rows(min_row=2, values_only=True):\n"
        f"    if row[2] is not None and row[2] < {threshold}:\n        out.append(list(row))\n"
    )
    return Spec(
        family="low_stock",
        instruction=(
            f"Create a sheet named 'Low Stock' with the header row of sheet 'Inventory' followed by every "
            f"Inventory row whose Stock is below {threshold}, in their original order."
        ),
        instruction_type=SHEET_LEVEL,
        sheets={"Inventory": [header, *items]},
        answer={"Low Stock": answer},
        answer_position=f"'Low Stock'!A1:D{len(kept) + 1}",
        program=HEAD + body + TAIL,
    )


def sort_rows(rng: random.Random, formula: bool) -> Spec | None:
    del formula
    n = rng.randint(8, 25)
    names = rng.sample([f"{p} {s}" for p in PEOPLE for s in SURNAMES], n)
    data: list[list[Any]] = [[name, rng.choice(DEPARTMENTS), rng.randint(30, 120) * 1000] for name in names]
    ordered = sorted(data, key=lambda row: (-row[2], row[0]))
    header = ["Name", "Department", "Salary"]
    answer = {f"{c}{r + 1}": v for r, row in enumerate([header, *ordered]) for c, v in zip("ABC", row, strict=True)}
    body = (
        "src = wb['Employees']\nrows = list(src.iter_rows(min_row=2, values_only=True))\n"
        "rows.sort(key=lambda row: (-row[2], row[0]))\nout = wb.create_sheet('Sorted')\n"
        "out.append([c.value for c in src[1]])\nfor row in rows:\n    out.append(list(row))\n"
    )
    return Spec(
        family="sort",
        instruction=(
            "Create a sheet named 'Sorted' holding the header and all rows of sheet 'Employees', sorted by "
            "Salary from highest to lowest; rows with equal Salary in alphabetical order of Name."
        ),
        instruction_type=SHEET_LEVEL,
        sheets={"Employees": [header, *data]},
        answer={"Sorted": answer},
        answer_position=f"Sorted!A1:C{n + 1}",
        program=HEAD + body + TAIL,
    )


def summary(rng: random.Random, formula: bool) -> Spec | None:
    n, cats = rng.randint(10, 35), rng.sample(CATEGORIES, rng.randint(3, 5))
    day = datetime.datetime(2024, 1, 1)
    data: list[list[Any]] = [
        [day + datetime.timedelta(days=rng.randint(0, 364)), rng.choice(cats), cents(rng, 5, 2000)] for _ in range(n)
    ]
    totals = {c: sum(row[2] for row in data if row[1] == c) for c in sorted({row[1] for row in data})}
    if not all(safe(t) for t in totals.values()):
        return None
    answer: dict[str, Any] = {"A1": "Category", "B1": "Total"}
    for i, (cat, total) in enumerate(totals.items(), start=2):
        answer |= {f"A{i}": cat, f"B{i}": total}
    if formula:
        last = n + 1
        fill = f"    out.cell(i, 2).value = f'=SUMIF(Transactions!$B$2:$B${last},A{{i}},Transactions!$C$2:$C${last})'\n"
    else:
        fill = "    out.cell(i, 2).value = sum(row[2] for row in rows if row[1] == category)\n"
    body = (
        "rows = list(wb['Transactions'].iter_rows(min_row=2, values_only=True))\n"
        "out = wb.create_sheet('Summary')\nout.append(['Category', 'Total'])\n"
        "for i, category in enumerate(sorted({row[1] for row in rows}), start=2):\n"
        "    out.cell(i, 1).value = category\n" + fill
    )
    return Spec(
        family="summary",
        instruction=(
            "Create a sheet named 'Summary' with the header Category, Total in A1:B1 and one row per distinct "
            "Category of sheet 'Transactions', in alphabetical order, with the sum of its Amount."
        ),
        instruction_type=SHEET_LEVEL,
        sheets={"Transactions": [["Date", "Category", "Amount"], *data]},
        answer={"Summary": answer},
        answer_position=f"Summary!A1:B{len(totals) + 1}",
        program=HEAD + body + TAIL,
        formula=formula,
    )


def names(rng: random.Random, formula: bool) -> Spec | None:
    sheet = rng.choice(["Customer List", "Contacts"])
    n = rng.randint(6, 20)
    data: list[list[Any]] = [[rng.choice(PEOPLE), rng.choice(SURNAMES), rng.choice(CITIES)] for _ in range(n)]
    full, codes = [f"{a} {b}" for a, b, _ in data], [c[:3].upper() for _, _, c in data]
    if formula:
        body = (
            "for r in range(2, ws.max_row + 1):\n"
            "    ws[f'D{r}'] = f'=A{r}&\" \"&B{r}'\n"
            "    ws[f'E{r}'] = f'=UPPER(LEFT(C{r},3))'\n"
        )
    else:
        body = (
            "for r in range(2, ws.max_row + 1):\n"
            "    ws.cell(r, 4).value = f'{ws.cell(r, 1).value} {ws.cell(r, 2).value}'\n"
            "    ws.cell(r, 5).value = ws.cell(r, 3).value[:3].upper()\n"
        )
    ref = quote(sheet)
    return Spec(
        family="names",
        instruction=(
            f"In sheet '{sheet}', fill D2:D{n + 1} (Full Name) with First and Last joined by one space, and "
            f"E2:E{n + 1} (City Code) with the first three letters of City in upper case."
        ),
        instruction_type=CELL_LEVEL,
        sheets={sheet: [["First", "Last", "City", "Full Name", "City Code"], *data]},
        answer={sheet: _column(full, "D") | _column(codes, "E")},
        answer_position=f"{ref}!D2:D{n + 1},{ref}!E2:E{n + 1}",
        program=HEAD + f"ws = wb[{sheet!r}]\n" + body + TAIL,
        formula=formula,
    )


def shares(rng: random.Random, formula: bool) -> Spec | None:
    sheet, n = "Budget 2024", rng.randint(4, 7)
    data: list[list[Any]] = [[dept, cents(rng, 1000, 90000)] for dept in rng.sample(DEPARTMENTS, n)]
    total = sum(row[1] for row in data)
    raw = [row[1] / total * 100 for row in data]
    if not all(safe(v, 1) for v in raw):
        return None
    if formula:
        body = f"for r in range(2, ws.max_row + 1):\n    ws[f'C{{r}}'] = f'=ROUND(B{{r}}/SUM($B$2:$B${n + 1})*100,1)'\n"
    else:
        body = (
            "total = sum(ws.cell(r, 2).value for r in range(2, ws.max_row + 1))\n"
            "for r in range(2, ws.max_row + 1):\n"
            "    ws.cell(r, 3).value = round(ws.cell(r, 2).value / total * 100, 1)\n"
        )
    return Spec(
        family="shares",
        instruction=(
            f"In sheet '{sheet}', fill C2:C{n + 1} (Share %) with each Department's Spend as a percentage of "
            "the total Spend, rounded to one decimal (e.g. 12.5 for 12.5%)."
        ),
        instruction_type=CELL_LEVEL,
        sheets={sheet: [["Department", "Spend", "Share %"], *data]},
        answer={sheet: _column([round(v, 1) for v in raw], "C")},
        answer_position=f"{quote(sheet)}!C2:C{n + 1}",
        program=HEAD + f"ws = wb[{sheet!r}]\n" + body + TAIL,
        formula=formula,
    )


Family = Callable[[random.Random, bool], Spec | None]
FAMILIES: dict[str, Family] = {
    "aggregate": aggregate,
    "lookup": lookup,
    "grades": grades,
    "dates": dates,
    "low_stock": low_stock,
    "sort": sort_rows,
    "summary": summary,
    "names": names,
    "shares": shares,
}
"""Every family, in the order tasks cycle through them."""
