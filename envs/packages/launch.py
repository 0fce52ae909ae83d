"""Starting the bridge with an env package's python: its code, its environment, one-shot commands.

The bridge's files are copied, once per version of them, to `<root>/.bridge/<digest>/gymflow_bridge/`
and only that directory goes on the bridge's `PYTHONPATH`: the package venv sees the bridge and its
own site-packages, nothing of gymflow's venv (whose pins it would clash with).

The bridge's environment is what an MCP server of gymflow's gets (`transport.server_env`: no secrets
of the worker), plus the env to run (`GYMFLOW_BRIDGE_ENV`) and a `PATH` that starts with the
install's `shims/` and the venv's `bin/`. `shims/uvx` stands in for uv's `uvx`, offline: env code
that starts a tool with `uvx NAME` (benchmax's math env starts `uvx mcp-server-calculator`) runs
the `NAME` the venv already has (install it with `--with NAME`), never a download.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from gymflow.envs.errors import PackageError
from gymflow.envs.packages import store
from gymflow.envs.packages.bridge.__main__ import ENV_VAR
from gymflow.envs.packages.store import EnvDecl, PackageRecord
from gymflow.envs.runtime.transport import server_env

BRIDGE_SOURCE = Path(__file__).with_name("bridge")
BRIDGE_MODULE = "gymflow_bridge"
ONE_SHOT_TIMEOUT_S = 900.0
"""A describe or dataset command (an env that downloads its dataset may take a while)."""

_UVX = """#!/bin/sh
# gymflow's offline stand-in for uv's uvx in an env package's venv: runs a tool the venv has.
tool="$1"
case "$tool" in
  ""|-*) echo "uvx (gymflow): only 'uvx NAME [ARGS]' is supported here, got: $*" >&2; exit 2 ;;
esac
shift
exe="{bin}/$tool"
if [ ! -x "$exe" ]; then
  echo "uvx (gymflow): $tool is not installed in this env package's venv ({bin});" \
    "install the package again with --with $tool" >&2
  exit 127
fi
exec "$exe" "$@"
"""


def bridge_path() -> Path:
    """The directory to put on the bridge's PYTHONPATH (holding `gymflow_bridge/`), made if missing."""
    sources = sorted(BRIDGE_SOURCE.glob("*.py"))
    digest = hashlib.sha256(b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in sources)).hexdigest()[:16]
    home = store.root() / ".bridge" / digest
    if not (home / BRIDGE_MODULE / "__main__.py").is_file():
        staging = home.with_name(f".{digest}.{uuid.uuid4().hex[:8]}")
        (staging / BRIDGE_MODULE).mkdir(parents=True)
        for path in sources:
            shutil.copyfile(path, staging / BRIDGE_MODULE / path.name)
        try:
            staging.rename(home)
        except OSError:  # another process made it first
            shutil.rmtree(staging, ignore_errors=True)
    return home


def shims(record: PackageRecord) -> Path:
    """The install's `shims/` directory (made if missing)."""
    directory = record.directory / "shims"
    uvx = directory / "uvx"
    if not uvx.is_file():
        directory.mkdir(exist_ok=True)
        tmp = uvx.with_suffix(".tmp")
        tmp.write_text(_UVX.replace("{bin}", str(record.venv / "bin")))
        tmp.chmod(0o755)
        tmp.replace(uvx)
    return directory


def decl_json(decl: EnvDecl) -> str:
    return json.dumps({"target": decl.target, "kind": decl.kind, "options": decl.options})


def bridge_env(record: PackageRecord, decl: EnvDecl | None, *, target: str | None = None) -> dict[str, str]:
    """The bridge process's extra environment variables (on top of `server_env`'s basics)."""
    spec = decl_json(decl) if decl is not None else json.dumps({"target": target, "kind": "", "options": {}})
    path = os.pathsep.join([str(shims(record)), str(record.venv / "bin"), os.environ.get("PATH", os.defpath)])
    return {
        "PYTHONPATH": str(bridge_path()),
        ENV_VAR: spec,
        "PATH": path,
        "VIRTUAL_ENV": str(record.venv),
        "PYTHONNOUSERSITE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def bridge_preload(decl: EnvDecl) -> list[str]:
    """What a bridge's fork server imports besides the bridge: the env's module and the bridge's adapter
    for its kind (a bridge imports both only once it runs), so each rollout's bridge is forked with them."""
    module = decl.target.partition(":")[0]
    adapter = {"verifiers": "verifiers", "openenv": "openenv", "benchmax": "plain", "plain": "plain"}.get(decl.kind)
    wanted = [f"{BRIDGE_MODULE}.{adapter}"] if adapter else []
    if all(part.isidentifier() for part in module.split(".")):
        wanted.append(module)
    return wanted


def bridge_args(command: str, *args: str) -> list[str]:
    return ["-m", BRIDGE_MODULE, command, *args]


def run_one_shot(
    record: PackageRecord, decl: EnvDecl | None, command: str, *args: str, target: str | None = None
) -> dict[str, Any]:
    """Run a one-shot bridge command in a scratch directory; its JSON answer.

    Raises:
        PackageError: The command failed; the message ends with the end of its stderr.
    """
    env = server_env(bridge_env(record, decl, target=target))
    with tempfile.TemporaryDirectory(prefix="gymflow-bridge-") as scratch:
        try:
            done = subprocess.run(
                [str(record.python_path), *bridge_args(command, *args)],
                cwd=scratch,
                env=env,
                capture_output=True,
                text=True,
                timeout=ONE_SHOT_TIMEOUT_S,
                check=False,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise PackageError(
                f"{record.name} {record.version}: its venv is gone ({exc}); {record.install_command()}"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise PackageError(f"{record.name}: `{command}` took over {ONE_SHOT_TIMEOUT_S:g}s") from exc
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        answer = dict(json.loads(lines[-1])) if lines else {}
    except ValueError:
        answer = {}
    if done.returncode or "error" in answer or not answer:
        what = (decl.name if decl else target) or record.name
        reason = answer.get("error") or f"exit status {done.returncode}"
        tail = done.stderr.strip()[-2000:]
        raise PackageError(
            f"{what} ({record.name} {record.version}): {command} failed: {reason}" + (f"\n{tail}" if tail else "")
        )
    return answer
