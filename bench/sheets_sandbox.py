"""Sandbox overhead and recalculation time of the sheets env (JSON on stdout).

    .venv/bin/python bench/sheets_sandbox.py [--runs 20]

* ``overhead_ms``: median wall time of running ``pass`` in each available sandbox mode, minus the
  median of the same ``python -I -`` started bare: what isolation adds to every code run.
* ``reference_run_ms``: median time of a generated task's reference program (openpyxl load,
  edit, save) in the default sandbox.
* ``extract_ms``: median time of the reward's sandboxed extraction of the answer cells, for a
  value answer and for a formula answer (the second includes the `formulas` engine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gymflow.envs.builtin.sheets import book, generate
from gymflow.envs.builtin.sheets.rewards import REWARD_LIMITS
from gymflow.envs.builtin.sheets.sandbox import Level, Sandbox, SandboxUnavailable, probe


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 1)


def _timed(fn: object, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return _median_ms(samples)


def _workspace_with(seed: int, index: int, root: Path) -> tuple[Path, str]:
    rid = generate.row_id(seed, index)
    folder = generate.ensure_row(root, seed, index)
    ws = Path(tempfile.mkdtemp(prefix="bench-ws-"))
    ws.chmod(0o755)
    (ws / "input.xlsx").write_bytes((folder / f"1_{rid}_input.xlsx").read_bytes())
    return ws, generate.spec(seed, index).program


def main() -> None:
    """Measure and print the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    ws = Path(tempfile.mkdtemp(prefix="bench-ws-"))
    ws.chmod(0o755)

    def bare() -> None:
        subprocess.run([sys.executable, "-I", "-"], input=b"pass", check=True, cwd=ws)

    bare_ms = _timed(bare, runs)
    overhead = {}
    for level in Level:
        for own_uid in (True, False):
            if probe(level, own_uid=own_uid) is not None:
                continue
            try:
                box = Sandbox(level=level, own_uid=own_uid)
            except SandboxUnavailable:
                continue
            name = f"{level}{'+own_uid' if box.uid is not None else ''}"
            overhead[name] = round(_timed(lambda box=box: box.run("pass", workspace=ws), runs) - bare_ms, 1)
    box = Sandbox()
    cache = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    # the first generated tasks of seed 0 with a value answer and with a formula answer
    value_ws = formula_ws = None
    for index in range(18):
        drawn = generate.spec(0, index)
        if drawn.formula and formula_ws is None:
            formula_ws = (_workspace_with(0, index, cache), drawn)
        if not drawn.formula and value_ws is None:
            value_ws = (_workspace_with(0, index, cache), drawn)
    figures: dict[str, object] = {"mode": box.describe(), "bare_python_ms": bare_ms, "overhead_ms": overhead}
    extract: dict[str, float] = {}
    for label, entry in (("value_answer", value_ws), ("formula_answer", formula_ws)):
        assert entry is not None
        (path, program), drawn = entry
        run_ms = _timed(lambda path=path, program=program: box.run(program, workspace=path), max(runs // 4, 3))
        figures.setdefault("reference_run_ms", {})[label] = run_ms  # type: ignore[index]
        areas = [[a.sheet or next(iter(drawn.sheets)), a.ref()] for a in book.parse_position(drawn.answer_position)]
        reward_box = Sandbox(limits=REWARD_LIMITS)
        code = book.program("extract", path="output.xlsx", areas=areas)
        extract[label] = _timed(
            lambda path=path, code=code, rbox=reward_box: rbox.run(code, workspace=path), max(runs // 4, 3)
        )
    figures["extract_ms"] = extract
    figures["cpus"] = os.cpu_count()
    figures["load_avg_1m"] = os.getloadavg()[0]
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
