"""`gymflow.run`, a script's ending: asyncio.run, atexit handlers, flushed output, then no teardown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import atexit, sys
import gymflow

atexit.register(lambda: open(sys.argv[1], "w").write("atexit ran"))

async def main():
    print("partial line, no newline", end="")
    {body}

if __name__ == "__main__":
    gymflow.run(main())
    print("never reached")
"""


@pytest.mark.parametrize(
    ("body", "code", "stderr_has"),
    [
        ("return 7", 0, ""),
        ("raise ValueError('the script failed')", 1, "ValueError: the script failed"),
        ("sys.exit(3)", 3, ""),
        ("sys.exit('a message')", 1, "a message"),
        ("raise KeyboardInterrupt", 130, ""),
    ],
)
def test_run_ends_a_script_with_its_code_after_its_atexit_handlers(
    tmp_path: Path, body: str, code: int, stderr_has: str
) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.replace("{body}", body))
    marker = tmp_path / "marker"
    done = subprocess.run(
        [sys.executable, str(script), str(marker)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == code, done.stderr
    assert done.stdout == "partial line, no newline"  # flushed before the exit; nothing after run()
    assert stderr_has in done.stderr
    assert marker.read_text() == "atexit ran"
