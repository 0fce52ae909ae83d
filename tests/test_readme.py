"""Every ```python block of the README runs as written.

Each block is a program of its own: it must compile, name nothing it does not define or import
(ruff's undefined-name checks, which also reach into function bodies that never run here), and
run to a zero exit code in a fresh interpreter, in an empty directory, against the session's dev
server. A block gets what the README tells a reader to set up, through the variables gymflow
reads: `GYMFLOW_TEMPORAL_ADDRESS` (and `TEMPORAL_ADDRESS`), `GYMFLOW_TASK_QUEUE` of a running
worker, `GYMFLOW_MODEL_URL` of the math env's baseline policy served over HTTP.

A block may opt out of running (never of the static checks) with a first line
``# not run: <reason>``; the opt-outs are counted and reported, and stay rare.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import figures
import pytest

from gymflow.workers.worker import RunningWorker

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
OPT_OUT = re.compile(r"#\s*not run:\s*(?P<reason>\S.*)")
UNDEFINED_NAMES = "F821,F822,F823"
"""ruff (pyflakes) rules: undefined name, undefined name in __all__, local used before assignment."""


@dataclass(frozen=True)
class Block:
    line: int
    """Line of the README where the block's code starts."""
    code: str

    @property
    def skip_reason(self) -> str | None:
        first = self.code.lstrip().splitlines()[0] if self.code.strip() else ""
        match = OPT_OUT.fullmatch(first.strip())
        return match["reason"] if match else None


def python_blocks(text: str) -> list[Block]:
    """The README's fenced ```python blocks (indented ones, in lists, dedented)."""
    blocks, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        opening = re.fullmatch(r"(\s*)```python\s*", lines[index])
        index += 1
        if not opening:
            continue
        indent, start, body = opening[1], index, []
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index].removeprefix(indent))
            index += 1
        index += 1
        blocks.append(Block(line=start + 1, code="\n".join(body) + "\n"))
    return blocks


BLOCKS = python_blocks(README.read_text())
IDS = [f"README.md:{b.line}" for b in BLOCKS]


def test_the_readme_has_python_blocks_and_few_opt_outs() -> None:
    opted_out = [b for b in BLOCKS if b.skip_reason]
    figures.record("docs", "README python blocks", blocks=len(BLOCKS), not_run=len(opted_out))
    assert BLOCKS, "no ```python block found: the extraction is broken"
    assert len(opted_out) <= max(1, len(BLOCKS) // 4), [f"README.md:{b.line}: {b.skip_reason}" for b in opted_out]


def test_the_opt_out_marker_and_the_extraction() -> None:
    text = "intro\n\n  ```python\n  # not run: needs a GPU\n  x = 1\n  ```\n```python\nprint(1)\n```\n"
    text += "```bash\nls\n```\n"
    first, second = python_blocks(text)
    assert (first.line, first.code, first.skip_reason) == (4, "# not run: needs a GPU\nx = 1\n", "needs a GPU")
    assert (second.code, second.skip_reason) == ("print(1)\n", None)


@pytest.mark.parametrize("block", BLOCKS, ids=IDS)
async def test_block_compiles_and_names_only_what_it_defines(block: Block, tmp_path: Path) -> None:
    compile(block.code, f"README.md:{block.line}", "exec")  # a SyntaxError names the README line
    path = tmp_path / "block.py"
    path.write_text(block.code)
    lint = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", UNDEFINED_NAMES,
        "--output-format", "concise", str(path), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await lint.communicate()
    assert lint.returncode == 0, f"README.md:{block.line}:\n{out.decode()}"


@pytest.mark.parametrize("block", BLOCKS, ids=IDS)
@pytest.mark.heavy
async def test_block_runs_as_written(
    block: Block, worker: RunningWorker, temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    if block.skip_reason:
        pytest.skip(f"README.md:{block.line} is marked not run: {block.skip_reason}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "block.py").write_text(block.code)
    environ = {
        **os.environ,
        "GYMFLOW_TEMPORAL_ADDRESS": temporal_address,
        "TEMPORAL_ADDRESS": temporal_address,
        "GYMFLOW_TASK_QUEUE": worker.task_queue,
        "GYMFLOW_MODEL_URL": calculator_policy_url,
        "GYMFLOW_DATA_DIR": str(tmp_path / "data"),
    }
    # Asynchronously: the worker and the policy server answer from this event loop meanwhile.
    process = await asyncio.create_subprocess_exec(
        sys.executable, "block.py", cwd=run_dir, env=environ,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 100)
    said = f"README.md:{block.line} exited {process.returncode}:\n{out.decode()[-1000:]}\n{err.decode()[-3000:]}"
    assert process.returncode == 0, said
    assert "Traceback" not in err.decode(), err.decode()[-3000:]
