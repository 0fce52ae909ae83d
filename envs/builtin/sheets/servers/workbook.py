"""The spreadsheet env's MCP server: a sandboxed Python runner and structured workbook tools.

One process per rollout, started with the rollout's workspace as its cwd:
``python -m gymflow.envs.builtin.sheets.servers.workbook --level bwrap --wall-s 30 ...``.

Design decisions:

* Everything runs in the sandbox (`gymflow.envs.builtin.sheets.sandbox`). ``run_python`` runs the model's program;
  ``describe_workbook``, ``read_range`` and ``write_cells`` run `gymflow.envs.builtin.sheets.book` there too, so
  this process never parses a file the model could have written. One sandbox (one uid) per
  server, one run at a time.
* ``run_python`` runs model code only in a sandbox that bounds its processes
  (``Guarantee.PROCESS_LIMIT``), whatever the worker decided: a server whose sandbox lacks it
  (e.g. its pids cgroup is gone) refuses, naming the fix.
* Errors are observations: a program that fails, times out or hits a limit, a bad path, a missing
  sheet, a broken workbook all raise ``ToolError`` (an ``is_error`` result naming the cause), and
  the server goes on serving the rollout.
* Output is bounded: each of stdout and stderr keeps its head and tail (`Limits.output_chars`),
  reads return at most `book.MAX_READ_CELLS` cells.
* Paths are checked against the workspace here as well (``..``, absolute paths, symlinks out), so
  the structured tools refuse an escape even at sandbox levels without mount confinement.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from gymflow.envs.builtin.sheets import book
from gymflow.envs.builtin.sheets.data import INPUT_NAME, OUTPUT_NAME
from gymflow.envs.builtin.sheets.isolation import REFUSAL
from gymflow.envs.builtin.sheets.sandbox import Guarantee, Limits, RunResult, Sandbox
from gymflow.envs.errors import WorkspaceError
from gymflow.envs.runtime.workspace import resolve_inside

MAX_CODE_CHARS = 100_000
"""Longest program `run_python` accepts."""
CODE_NEEDS = frozenset({Guarantee.LIMITS, Guarantee.PROCESS_LIMIT})
"""What a sandbox must promise before model code runs in it (isolation is the worker's decision)."""

server = MCPServer(
    "sheets",
    instructions=(
        f"Tools for one workbook task. The input is {INPUT_NAME}; save the result as {OUTPUT_NAME}. "
        "run_python runs your Python (openpyxl available) in a sandbox with the workspace as its working "
        "directory, no network and CPU/memory/time limits; describe_workbook, read_range and write_cells "
        "inspect and edit workbooks directly."
    ),
)
_sandbox: list[Sandbox] = []
_refuse_code: list[bool] = [False]


def configure(sandbox: Sandbox, *, refuse_code: bool = False) -> None:
    """Use `sandbox` for every tool (main() does this from the command line).

    Args:
        sandbox: Where programs run.
        refuse_code: Refuse ``run_python`` (no sandbox level here guarantees isolation); the
            other tools run only this package's own code and still work.
    """
    _sandbox[:] = [sandbox]
    _refuse_code[0] = refuse_code


def sandbox() -> Sandbox:
    """The configured sandbox (the strongest available with default limits if none was)."""
    if not _sandbox:
        _sandbox.append(Sandbox())
    return _sandbox[0]


def _workspace_path(name: str) -> str:
    try:
        resolve_inside(Path.cwd(), name)
    except WorkspaceError as exc:
        raise ToolError(str(exc)) from None
    return name


async def _run(code: str) -> RunResult:
    return await anyio.to_thread.run_sync(functools.partial(sandbox().run, code, workspace=Path.cwd()))


async def _book(op: str, **args: object) -> str:
    result = await _run(book.program(op, **args))
    parsed = book.parse_result(result.stdout)
    if parsed is None:
        raise ToolError(f"{op} failed: {result.problem() or 'no result'}\n{result.stderr.strip()[-1500:]}")
    if not parsed.get("ok"):
        raise ToolError(str(parsed.get("error")))
    return str(parsed["text"])


def report(result: RunResult) -> str:
    """A run's outcome as the model reads it."""
    problem = result.problem()
    head = f"exit status {result.returncode} ({result.duration_ms:.0f} ms)"
    parts = [f"error: {problem}; {head}" if problem else head]
    if result.stdout:
        parts.append("stdout:\n" + result.stdout.rstrip())
    if result.stderr:
        parts.append("stderr:\n" + result.stderr.rstrip())
    if not result.stdout and not result.stderr:
        parts.append("(no output)")
    return "\n".join(parts)


@server.tool()
async def run_python(code: str) -> str:
    """Run a Python 3 program in a sandbox whose working directory holds input.xlsx.

    openpyxl is installed. Save your result with ``wb.save("output.xlsx")``; formulas you write
    (``ws["B2"] = "=SUM(A1:A9)"``) are recalculated when the result is checked. There is no
    network, and CPU time, memory, file size, processes and wall time are limited: a program that
    exceeds a limit is stopped and the error says which. Returns exit status, stdout and stderr.

    Args:
        code: The program's source.
    """
    if _refuse_code[0] or not sandbox().guarantees >= CODE_NEEDS:
        raise ToolError(REFUSAL)
    if len(code) > MAX_CODE_CHARS:
        raise ToolError(f"the program is {len(code)} characters; at most {MAX_CODE_CHARS} are accepted")
    result = await _run(code)
    text = report(result)
    if not result.ok:
        raise ToolError(text)
    return text


@server.tool()
async def describe_workbook(path: str = INPUT_NAME) -> str:
    """List a workbook's sheets with their used ranges and sizes.

    Args:
        path: Workbook file in the workspace.
    """
    return await _book("describe", path=_workspace_path(path))


@server.tool()
async def read_range(ref: str, path: str = INPUT_NAME, formulas: bool = True, styles: bool = False) -> str:
    """Read the cells of a range: values, formulas (with cached values) and optionally basic styles.

    Empty cells are skipped; at most 400 cells are returned per call.

    Args:
        ref: A cell or range, optionally with its sheet: "A1:D20", "'Sales Data'!B2:B40", "Sheet2!C:C".
        path: Workbook file in the workspace.
        formulas: Show formulas of formula cells.
        styles: Show bold/italic, font and fill colours and number formats.
    """
    return await _book("read", path=_workspace_path(path), ref=ref, formulas=formulas, styles=styles)


@server.tool()
async def write_cells(
    cells: dict[str, str | int | float | bool | None],
    sheet: str | None = None,
    path: str = OUTPUT_NAME,
    source: str = INPUT_NAME,
    create_sheet: bool = False,
) -> str:
    """Set cells of a workbook and save it. A text value starting with "=" is a formula.

    When `path` does not exist yet, it starts as a copy of `source`, so the first call with the
    defaults creates output.xlsx from input.xlsx.

    Args:
        cells: Cell name -> value, e.g. {"G2": 41.5, "G3": "=COUNTIF(A2:A40,\\"North\\")"}.
        sheet: Sheet to write (default: the active sheet).
        path: Workbook to write (default output.xlsx).
        source: Workbook `path` starts from when it does not exist yet.
        create_sheet: Create `sheet` if the workbook lacks it.
    """
    return await _book(
        "write",
        path=_workspace_path(path),
        cells=cells,
        sheet=sheet,
        source=_workspace_path(source),
        create=create_sheet,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the sandbox settings and serve over stdio."""
    parser = argparse.ArgumentParser(description=__doc__)
    defaults = Limits()
    parser.add_argument("--level", default=None, help="sandbox level: bwrap, unshare, rlimits or auto")
    uid = parser.add_mutually_exclusive_group()
    uid.add_argument("--own-uid", dest="own_uid", action="store_true", default=None, help="drop to a sandbox uid")
    uid.add_argument("--caller-uid", dest="own_uid", action="store_false", help="run as this server's uid")
    parser.add_argument("--refuse-code", action="store_true", help="refuse run_python (no isolating level here)")
    parser.add_argument("--cpu-s", type=int, default=defaults.cpu_s)
    parser.add_argument("--wall-s", type=float, default=defaults.wall_s)
    parser.add_argument("--memory-mb", type=int, default=defaults.memory_mb)
    parser.add_argument("--file-mb", type=int, default=defaults.file_mb)
    parser.add_argument("--processes", type=int, default=defaults.processes)
    parser.add_argument("--workspace-mb", type=int, default=None, help="disk quota of the workspace")
    args = parser.parse_args(argv)
    limits = Limits(
        cpu_s=args.cpu_s,
        wall_s=args.wall_s,
        memory_mb=args.memory_mb,
        file_mb=args.file_mb,
        processes=args.processes,
        workspace_mb=args.workspace_mb,
    )
    configure(Sandbox(level=args.level, own_uid=args.own_uid, limits=limits), refuse_code=args.refuse_code)
    refusing = "; run_python refused" if args.refuse_code else ""
    print(f"sheets server: sandbox {sandbox().describe()}{refusing}", file=sys.stderr)
    server.run()


if __name__ == "__main__":
    main()
