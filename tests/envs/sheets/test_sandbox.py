"""The code sandbox, at every mode this machine offers: each promises exactly its `guarantees`.

The level .ci/run installs (bubblewrap, announced in $GYMFLOW_SANDBOX_REQUIRE) must be the one
in use: when it is not, `test_the_installed_level_is_active` fails, it does not skip. Every mode
(level, and as root whether the uid is dropped) is forced here too, and each test checks both
directions: a promised guarantee holds, and a guarantee that is not promised is not claimed by
mistake (where that is safe to show). A hostile program (a fork bomb) is only ever sent to a mode
that promises to contain it; elsewhere the test skips, saying why.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_census import SPAWN_200, UNBOUNDED, Census, leftover_cgroups, programs_left

from gymflow.envs.builtin.sheets import cgroup
from gymflow.envs.builtin.sheets.runs import WRAPPER_TASKS
from gymflow.envs.builtin.sheets.sandbox import (
    MB,
    REQUIRE_ENV,
    Guarantee,
    Level,
    Limits,
    RunResult,
    Sandbox,
    detect,
    guarantees,
    is_root,
    probe,
)
from gymflow.envs.runtime.workspace import usage

SMALL = Limits(cpu_s=2, wall_s=30.0, memory_mb=512, file_mb=2, processes=16, output_chars=2000)
"""The wall limit is generous: CI machines are shared and loaded; only the sleep test relies on it."""
REPO = Path(__file__).resolve().parents[3]
NEEDS_BWRAP = "needs bubblewrap: apt-get install bubblewrap"


MODES = [(level, own_uid) for level in Level for own_uid in (True, False)]


@pytest.fixture(params=MODES, ids=[f"{level}-{'own' if own else 'caller'}-uid" for level, own in MODES])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    level, own_uid = request.param
    if own_uid and not is_root():
        pytest.skip("dropping to a sandbox uid needs root")
    reason = probe(level, own_uid=own_uid)
    if reason is not None:
        if os.environ.get(REQUIRE_ENV) == level and own_uid == is_root():
            pytest.fail(f".ci/run installed {level} but it does not work: {reason}")
        hint = f": {NEEDS_BWRAP}" if level is Level.BWRAP else ""
        pytest.skip(f"mode {level} ({'own' if own_uid else 'caller'} uid) does not work here ({reason}){hint}")
    return Sandbox(level=level, own_uid=own_uid, limits=SMALL)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    return path


def uid_processes(uid: int, *, deadline_s: float = 5.0) -> list[int]:
    """Live (not zombie) processes of `uid`, once none are left or the deadline passes.

    Killed processes can linger a moment as zombies until their new parent reaps them.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        found = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if (
                        entry.stat().st_uid == uid
                        and Path(entry.path, "stat").read_text().split(")")[-1].split()[0] != "Z"
                    ):
                        found.append(int(entry.name))
                except (OSError, IndexError):
                    continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_the_installed_level_is_active() -> None:
    level, own_uid = detect()
    required = os.environ.get(REQUIRE_ENV)
    if required:
        assert level == required, f"{REQUIRE_ENV}={required} but the active sandbox level is {level}"
        assert own_uid == is_root(), "running as root, the sandbox must drop to its own uid"
    assert guarantees(level, own_uid=own_uid) <= set(Guarantee)
    if level is Level.BWRAP and own_uid:
        assert guarantees(level, own_uid=own_uid) == set(Guarantee)


def test_runs_python_with_openpyxl_in_the_workspace(sandbox: Sandbox, workspace: Path) -> None:
    code = "import openpyxl, sys\nwb = openpyxl.Workbook()\nwb.save('made.xlsx')\nprint('hello', sys.argv[1:])"
    result = sandbox.run(code, workspace=workspace, args=["x"])
    assert result.ok, result.stderr
    assert result.stdout.strip() == "hello ['x']"
    assert (workspace / "made.xlsx").is_file()
    assert result.problem() is None


def test_network(sandbox: Sandbox, workspace: Path, listener: int) -> None:
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=2).close()\nprint('connected')"
    result = sandbox.run(code, workspace=workspace)
    if Guarantee.NO_NETWORK in sandbox.guarantees:
        assert not result.ok and "connected" not in result.stdout
        assert "Connection refused" in result.stderr or "unreachable" in result.stderr
    else:
        assert result.ok and "connected" in result.stdout  # not promised, and indeed not provided


def test_private_files(sandbox: Sandbox, workspace: Path, tmp_path: Path) -> None:
    vault = tmp_path / "answers"
    vault.mkdir(mode=0o700)
    (vault / "1_x_answer.xlsx").write_text("the answer")
    code = f"print(open({str(vault / '1_x_answer.xlsx')!r}).read())"
    result = sandbox.run(code, workspace=workspace)
    if Guarantee.PRIVATE_FILES in sandbox.guarantees:
        assert not result.ok and "the answer" not in result.stdout
        assert "PermissionError" in result.stderr or "FileNotFoundError" in result.stderr
    else:
        assert "the answer" in result.stdout


def test_filesystem_confinement(sandbox: Sandbox, workspace: Path) -> None:
    if Guarantee.FS_CONFINED not in sandbox.guarantees:
        result = sandbox.run("print(open('/etc/hostname').read() != '')", workspace=workspace)
        assert result.stdout.strip() == "True"  # the host's files are there: not promised
        return
    code = f"""
import os
for path in ['/etc/hostname', '/etc/passwd', {str(REPO / "pyproject.toml")!r}, '../ws/../../x']:
    try:
        open(path).read()
        print('READ', path)
    except OSError as exc:
        print('refused', path, type(exc).__name__)
for path in [{sys.prefix!r} + '/pwned', '/usr/lib/pwned']:
    try:
        open(path, 'w').write('x')
        print('WROTE', path)
    except OSError as exc:
        print('refused', path, type(exc).__name__)
open('/tmp/scratch', 'w').write('private tmp')
print(sorted(os.listdir('/')))
"""
    result = sandbox.run(code, workspace=workspace)
    assert result.ok, result.stderr
    assert "READ" not in result.stdout and "WROTE" not in result.stdout
    assert not Path(sys.prefix, "pwned").exists()
    assert not Path("/tmp/scratch").exists()  # the sandbox's /tmp is its own
    assert "'etc'" not in result.stdout and "'home'" not in result.stdout


def test_memory_bomb_is_stopped(sandbox: Sandbox, workspace: Path) -> None:
    for code in (
        "x = bytearray(4 * 1024 ** 3)",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 ** 2))",
    ):
        result = sandbox.run(code, workspace=workspace)
        assert not result.ok and not result.timed_out
        assert "memory" in (result.problem() or "")


FORK_BOMB = """
import os, sys, time
refused = 0
while refused < 20:  # every process forks until the kernel has refused it 20 times, then exits
    try:
        os.fork()
    except OSError:
        refused += 1
        time.sleep(0.01)
print("fork refused")
sys.exit(3)
"""


def test_fork_bomb_is_stopped(sandbox: Sandbox, workspace: Path) -> None:
    if Guarantee.PROCESS_LIMIT not in sandbox.guarantees:
        pytest.skip(f"{sandbox.describe()} does not promise a process limit: no fork bomb is sent to it")
    limit = SMALL.processes
    # First a bounded program: it shows the limit holds before anything unbounded is sent.
    with Census() as seen:
        bounded = sandbox.run(SPAWN_200, workspace=workspace)
    started = int(bounded.stdout.split()[-1])
    assert 0 < started < limit, bounded.stdout
    assert seen.programs <= limit
    for code in (FORK_BOMB, UNBOUNDED):
        with Census() as seen:
            wall = SMALL if code is FORK_BOMB else dataclasses.replace(SMALL, wall_s=5.0)
            result = sandbox.run(code, workspace=workspace, limits=wall)
        print(
            f"{sandbox.describe()}: at most {seen.programs} sandboxed programs at once (limit {limit}); host "
            f"processes {seen.baseline} -> at most {seen.host}; peak cgroup tasks {result.peak_tasks}"
        )
        assert not result.ok
        assert seen.programs <= limit
        if result.peak_tasks is not None:
            assert result.peak_tasks <= limit + WRAPPER_TASKS[sandbox.level]
        if code is FORK_BOMB:
            assert result.returncode == 3 and not result.timed_out  # the kernel capped the process count
            assert "fork refused" in result.stdout
        else:  # a refused fork kills its process: the first to die may be the program's own
            assert result.timed_out or f"{limit}-process limit" in (result.problem() or ""), result
        assert programs_left() == 0 and leftover_cgroups() == []  # nothing of it survives the run
        if sandbox.uid is not None:
            assert uid_processes(sandbox.uid) == []


def test_infinite_loops_hit_the_limits(sandbox: Sandbox, workspace: Path) -> None:
    short = dataclasses.replace(SMALL, wall_s=3.0)
    sleeping = sandbox.run("import time\ntime.sleep(600)", workspace=workspace, limits=short)
    assert sleeping.timed_out and "wall-clock" in (sleeping.problem() or "")
    assert sleeping.duration_ms < 20_000
    spinning = sandbox.run("while True:\n    pass", workspace=workspace)
    assert not spinning.ok and "CPU time" in (spinning.problem() or "")


def test_file_size_and_output_are_bounded(sandbox: Sandbox, workspace: Path) -> None:
    big = sandbox.run("open('big.bin', 'wb').write(b'x' * (3 * 1024 * 1024))", workspace=workspace)
    assert not big.ok and "MB limit" in (big.problem() or "")
    flood = sandbox.run("while True:\n    print('spam' * 1000)", workspace=workspace)
    assert not flood.ok and not flood.timed_out
    assert len(flood.stdout) < SMALL.output_chars + 200 and "cut" in flood.stdout


def test_nothing_outlives_a_run(sandbox: Sandbox, workspace: Path) -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    result = sandbox.run(code, workspace=workspace)
    assert result.ok and "parent done" in result.stdout
    # The escaped child left the process group, but not the run's cgroup (nor its uid): it was killed.
    if cgroup.available() or sandbox.uid is not None:
        assert programs_left() == 0 and leftover_cgroups() == []
    if sandbox.uid is not None:
        assert uid_processes(sandbox.uid) == []


def test_workspace_modules_do_not_shadow_libraries(sandbox: Sandbox, workspace: Path) -> None:
    (workspace / "openpyxl.py").write_text("raise SystemExit('planted module imported')\n")
    result = sandbox.run("import openpyxl\nprint(openpyxl.__version__)", workspace=workspace)
    assert result.ok, result.stderr


def test_run_from_a_threaded_server_process(workspace: Path) -> None:
    """The MCP server calls run() from worker threads; the default sandbox works there too."""
    code = (
        "import threading\nfrom pathlib import Path\nfrom gymflow.envs.builtin.sheets.sandbox import Sandbox\n"
        "box = Sandbox()\nout = []\n"
        f"t = threading.Thread(target=lambda: out.append(box.run('print(1)', workspace=Path({str(workspace)!r}))))\n"
        "t.start(); t.join()\nprint(out[0].stdout.strip(), box.level)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "1"


def test_a_memory_error_is_named_even_when_the_cpu_limit_struck_while_it_was_reported() -> None:
    # Filling pages costs CPU: a memory bomb can raise MemoryError and then get SIGXCPU (exit
    # status 152) while its traceback is printed. The model must be told about memory.
    stderr = 'Traceback (most recent call last):\n  File "<stdin>", line 3, in <module>\nMemoryError\n'
    result = RunResult(152, "", stderr, 2045.0, Level.BWRAP, SMALL, cpu_s=2.0)
    assert "memory limit" in (result.problem() or "")


FILL = """
import os
for i in range(400):  # 400 MB in 1 MB files: none over the file limit, together far over the quota
    with open(f"fill{i}.bin", "wb") as f:
        f.write(os.urandom(1024 * 1024))
print("wrote them all")
"""


def test_the_workspace_quota_stops_a_run_and_deletions_still_work(sandbox: Sandbox, workspace: Path) -> None:
    quota = dataclasses.replace(SMALL, workspace_mb=16, file_mb=64, cpu_s=20)
    big = sandbox.run("open('one.bin', 'wb').write(b'x' * (20 * 1024 * 1024))", workspace=workspace, limits=quota)
    assert not big.ok and "16 MB" in (big.problem() or "")  # the file limit or the quota, whichever struck first
    assert usage(workspace) <= 16 * MB + 64 * 1024
    result = sandbox.run(FILL, workspace=workspace, limits=quota)
    assert result.over_quota and not result.ok and "wrote them all" not in result.stdout
    assert "16 MB disk quota" in (result.problem() or "")
    used = usage(workspace)
    # The check runs every QUOTA_POLL_S: what a program writes meanwhile is the only overshoot.
    print(f"quota 16 MB: the workspace holds {used / MB:.1f} MB after the stopped run")
    assert 16 * MB < used < 16 * MB + 64 * MB, used
    cleaned = sandbox.run(
        "import glob, os\nfor p in glob.glob('*.bin'):\n    os.remove(p)\nprint('clean')",
        workspace=workspace,
        limits=quota,
    )
    assert cleaned.ok and "clean" in cleaned.stdout, cleaned.stderr
    assert usage(workspace) < MB
