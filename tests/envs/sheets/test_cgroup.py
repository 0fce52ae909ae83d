"""Per-run pids cgroups (`gymflow.envs.builtin.sheets.cgroup`) on this machine's real cgroup filesystem.

Each test that needs a pids cgroup skips, saying why, where this process cannot make one (not
root, no pids controller, a v2 cgroup that cannot delegate it). The parsing of /proc/self/cgroup
and mountinfo is also checked against a v2 layout made in a temporary directory.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from gymflow.envs.builtin.sheets import cgroup
from gymflow.envs.builtin.sheets.isolation import CGROUP_FIX, choose
from gymflow.envs.builtin.sheets.sandbox import Guarantee, Level, guarantees, is_root, probe


@pytest.fixture
def base() -> Path:
    found = cgroup.parent()
    if not isinstance(found, Path):
        pytest.skip(f"no pids cgroup here: {found}")
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_run_cgroup_bounds_tasks_and_close_kills_what_is_left(base: Path) -> None:
    run = cgroup.create(6)
    assert run.path.parent == base and (run.path / "pids.max").read_text().strip() == "6"
    # The program enters before it runs anything; it starts 10 background sleepers and reports.
    script = "for i in 1 2 3 4 5 6 7 8 9 10; do (setsid sleep 600 >/dev/null 2>&1 &) 2>/dev/null; done"
    try:
        done = subprocess.run(
            [*run.enter(), "/bin/sh", "-c", script], check=False, capture_output=True, text=True, timeout=60
        )
        left = [int(pid) for pid in (run.path / "cgroup.procs").read_text().split()]
        assert 0 < len(left) <= 6, (done.stdout, done.stderr)
        assert run.refused() > 0  # some of the ten were refused
        peak = run.peak()
        assert peak is None or peak <= 6
    finally:
        assert run.close()
    assert not run.path.exists()
    assert not any(_alive(pid) for pid in left)  # setsid did not take them out of the cgroup


def test_leftovers_of_a_dead_process_are_swept(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A process that exists no more left a cgroup with a live process in it.
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    assert not Path(f"/proc/{gone}").exists()
    stale = base / f"{cgroup.PREFIX}{gone}-0"
    stale.mkdir()
    sleeper = subprocess.Popen(["/bin/sh", "-c", f'echo $$ > "{stale}/cgroup.procs" && exec sleep 600'])
    deadline = time.monotonic() + 10
    while str(sleeper.pid) not in (stale / "cgroup.procs").read_text().split():
        assert time.monotonic() < deadline, "the sleeper never entered its cgroup"
        time.sleep(0.01)
    mine = base / f"{cgroup.PREFIX}{os.getpid()}-keep"
    mine.mkdir()
    try:
        link = tmp_path / "pids"  # the same parent, under a name not looked up before: a fresh lookup sweeps
        link.symlink_to(base)
        monkeypatch.setenv(cgroup.CGROUP_ENV, str(link))
        assert cgroup.parent() == link
        assert not stale.exists() and sleeper.wait(timeout=10) == -9
        assert mine.exists()  # this process's own cgroups are not its business
    finally:
        mine.rmdir()


def test_none_acts_as_a_machine_without(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cgroup.CGROUP_ENV, "none")
    assert not cgroup.available() and "none" in str(cgroup.parent())
    with pytest.raises(OSError, match="no pids cgroup"):
        cgroup.create(8)
    # As root at the caller's uid, nothing else bounds processes: the guarantee is not claimed.
    assert (Guarantee.PROCESS_LIMIT in guarantees(Level.RLIMITS, own_uid=False)) == (not is_root())
    assert Guarantee.PROCESS_LIMIT in guarantees(Level.RLIMITS, own_uid=True)


def test_without_a_cgroup_bwrap_as_root_runs_no_model_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bubblewrap that cannot drop the uid (the issue's failure) plus no cgroup: model code is refused."""
    if not is_root():
        pytest.skip("as another user RLIMIT_NPROC bounds every mode: nothing to refuse")
    real = probe(Level.BWRAP, own_uid=False)
    if real is not None:
        pytest.skip(f"bwrap does not work here ({real}): needs bubblewrap: apt-get install bubblewrap")
    from gymflow.envs.runtime.confine import BWRAP_ENV, bwrap_binary

    wrapper = tmp_path / "bwrap"  # the real bubblewrap, except that dropping the uid fails
    wrapper.write_text(
        f'#!/bin/sh\ncase " $* " in *" --cap-add "*) echo "bwrap: setpriv: not found" >&2; exit 1;; esac\n'
        f'exec {bwrap_binary()} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv(BWRAP_ENV, str(wrapper))
    monkeypatch.delenv("GYMFLOW_SANDBOX", raising=False)
    if cgroup.available():
        with_cgroup = choose()
        assert (with_cgroup.level, with_cgroup.own_uid, with_cgroup.refuse_code) == (Level.BWRAP, False, False)
    monkeypatch.setenv(cgroup.CGROUP_ENV, "none")
    refused = choose()
    assert refused.refuse_code and refused.fix == CGROUP_FIX
    assert "nothing bounds root's processes without a pids cgroup" in refused.why
    from gymflow.envs.builtin.sheets.env import SheetsEnv

    problem = SheetsEnv.unavailable()
    assert problem is not None and "pids cgroup" in problem.fix
    assert SheetsEnv.unavailable(sandbox_level="unsafe-rlimits") is not None  # an opt-out needs it too


def test_a_v2_layout_is_found_and_delegated(tmp_path: Path) -> None:
    root = tmp_path / "unified"
    own = root / "worker.slice"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    lines = "0::/worker.slice\n"
    mounts = f"30 25 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw\n"
    assert cgroup.own_pids_cgroup(lines, mounts) == own
    assert (own / "cgroup.subtree_control").read_text() == "+pids"  # enabled for the run cgroups
    (own / "cgroup.controllers").write_text("cpu io memory\n")
    assert "no pids controller" in str(cgroup.own_pids_cgroup(lines, mounts))
    v1 = "8:pids:/ci/job\n0::/\n"
    mounts_v1 = f"31 25 0:27 / {tmp_path}/pids rw - cgroup cgroup rw,pids\n"
    assert cgroup.own_pids_cgroup(v1, mounts_v1) == tmp_path / "pids" / "ci" / "job"
    in_namespace = "8:pids:/ci/job\n"  # a cgroup namespace whose mount shows the subtree /ci
    mounts_ns = f"31 25 0:27 /ci {tmp_path}/pids rw - cgroup cgroup rw,pids\n"
    assert cgroup.own_pids_cgroup(in_namespace, mounts_ns) == tmp_path / "pids" / "job"
