"""Which sandbox mode a worker settles on, and why: tools by real path, modes passed over logged once.

The bug these guard against: with a PATH whose first directory held symlinks to the system tools,
``setpriv`` was named by its symlink, which does not exist inside bubblewrap; the preferred mode
failed for that incidental reason, and the worker silently settled on a weaker one.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gymflow.envs.builtin.sheets.sandbox import Level, detect, is_root, probe
from gymflow.envs.runtime.confine import BWRAP_ENV, which

REPO = Path(__file__).resolve().parents[3]
TOOLS = ("setpriv", "prlimit", "unshare", "bwrap", "kill", "sh")


def test_a_tool_found_through_a_symlink_is_named_by_its_real_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "opt" / "gymflow-test-tool"
    real.parent.mkdir()
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "gymflow-test-tool").symlink_to(real)
    monkeypatch.setenv("PATH", f"{shims}:/usr/bin:/bin")
    assert which("gymflow-test-tool") == str(real)


def test_system_tools_come_before_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = which("prlimit")
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "prlimit").write_text('#!/bin/sh\nexec /usr/bin/prlimit "$@"\n')  # a shim script, not a link
    (shims / "prlimit").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    assert which("prlimit") == system and system.startswith(("/usr/", "/bin/", "/sbin/"))


def test_a_path_of_symlinked_tools_does_not_change_the_mode(tmp_path: Path) -> None:
    """The issue's machine: the first PATH entry holds symlinks to the system tools."""
    preferred = (Level.BWRAP, is_root())
    reason = probe(*preferred[:1], own_uid=preferred[1])
    if reason is not None:
        pytest.skip(f"bwrap does not work here at all ({reason}): needs bubblewrap: apt-get install bubblewrap")
    shims = tmp_path / "shims"
    shims.mkdir()
    for tool in TOOLS:
        (shims / tool).symlink_to(which(tool))
    code = "from gymflow.envs.builtin.sheets.sandbox import detect\nlevel, own = detect()\nprint(level, own)"
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(Level.BWRAP), str(is_root())], done.stderr
    assert "passed over" not in done.stderr


def test_a_mode_passed_over_is_logged_once_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "bwrap"  # a bubblewrap that cannot set up its namespaces
    # Its message names the test's directory: each run of the test is a new reason, logged anew.
    broken.write_text(f"#!/bin/sh\necho 'bwrap: setting up uid map in {tmp_path}: Permission denied' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv(BWRAP_ENV, str(broken))
    with caplog.at_level(logging.INFO, logger="gymflow.envs.builtin.sheets.sandbox"):
        level, own_uid = detect()
        first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        assert detect() == (level, own_uid)
        again = [r.getMessage() for r in caplog.records]
    assert level is not Level.BWRAP
    bwrap = [m for m in first if m.startswith("sandbox mode bwrap")]
    assert len(bwrap) == (2 if is_root() else 1), first
    assert all("passed over for" in m and f"setting up uid map in {tmp_path}: Permission denied" in m for m in bwrap)
    assert again == []
