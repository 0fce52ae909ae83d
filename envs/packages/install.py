"""`gymflow envs install SPEC`: an env package into a venv of its own, checked, recorded.

SPEC is a PyPI requirement (`benchmax==0.1.1.dev7`), a wheel, a git URL (`git+https://...`) or a
local directory. Steps, each of which stops the install with pip's or the env's own words:

1. a fresh venv under `<root>/<install id>/` (never shared, so conflicting pins coexist);
2. a directory or git URL is built into a wheel first, kept in `dist/` (what a training bundle
   carries to other nodes, gymflow.activities.bundle), then `pip install --report` of the package and
   the `--with` requirements; the report names the package's distribution and version (and a git
   URL's commit);
3. the content digest: sha256 over the distribution's installed files as its RECORD lists them
   (`distribution_digest`), so the same code has the same digest on every node;
4. its envs: the distribution's `gymflow.envs` entry points plus `--env NAME=TARGET`; each is
   described by the bridge in the new venv (which proves it imports and builds) and its default
   dataset loaded once, so listings and evals start nothing;
5. the record (`package.json`) is written last; older installs of the same name and version go.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Collection, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from gymflow.envs.contract import ToolSpec
from gymflow.envs.errors import PackageError
from gymflow.envs.packages import launch, store
from gymflow.envs.packages.env import KIND_DATASETS, dataset_file
from gymflow.envs.packages.store import EnvDecl, PackageRecord, Source

ENTRY_POINT_GROUP = "gymflow.envs"
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_UNHASHED = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
"""dist-info files that say how or from where it was installed, not what it is."""

Say = Callable[[str], None]


def source_of(spec: str) -> Source:
    if spec.startswith(("git+", "git@")):
        return "git"
    path = Path(spec).expanduser()
    if path.is_dir():
        return "directory"
    if spec.endswith(".whl"):
        if not path.is_file():
            raise PackageError(f"no wheel {spec}")
        return "wheel"
    if _NAME.match(spec) is None:
        raise PackageError(f"{spec!r} is not a requirement, a wheel, a git URL or a directory")
    return "pypi"


def install(
    spec: str,
    *,
    extras: Sequence[str] = (),
    envs: dict[str, str] | None = None,
    options: dict[str, Any] | None = None,
    datasets: dict[str, str] | None = None,
    dataset_options: dict[str, Any] | None = None,
    policies: dict[str, str] | None = None,
    stateless: bool | Collection[str] = False,
    python: str | None = None,
    constraints: Path | None = None,
    expect_digest: str | None = None,
    say: Say = print,
) -> PackageRecord:
    """Install `spec` (see the module docstring) and return its record.

    Args:
        extras: Further requirements in the same venv (`--with`), e.g. pins the package needs.
        envs: Env name -> `module:attribute` for envs the package does not declare itself.
        options: Keyword arguments its envs are built with.
        datasets: The dataset `gymflow eval NAME` runs by default: env -> dataset name, `""` for
            every env. `dataset_options`: its loader's options.
        policies: Scripted baseline policies, name -> gymflow-side `module:Class` / `file.py:Class`
            (`ENV:NAME` keys: that env's).

    Options, dataset options and policies named `ENV:KEY` apply to env ENV only (`scoped`).
        stateless: The envs (True: all; else those named) keep no state a lost rollout needs: it is
            re-initialised on another node.
        python: The interpreter the venv is made from (default: this one's).
        constraints: A pip constraints file (every dependency's exact version, from a bundle).
        expect_digest: Refuse the install unless the package's digest is this one (from a bundle).

    Raises:
        PackageError: Any step failed; nothing of the install is left behind.
    """
    source = source_of(spec)
    install_id = uuid.uuid4().hex[:12]
    directory = store.root() / install_id
    directory.mkdir(parents=True)
    try:
        record = _install(
            spec, source, directory, extras=list(extras), envs=envs or {}, options=options or {},
            datasets=datasets or {}, dataset_options=dataset_options or {}, policies=policies or {},
            stateless=stateless, python=python or sys.executable, constraints=constraints, say=say,
        )  # fmt: skip
        _check_digest(record, expect_digest)
        store.write(record)
        for older in store.find_package(record.name, record.version):
            if older.id != record.id:
                (older.directory / store.RECORD).unlink(missing_ok=True)
                shutil.rmtree(older.directory, ignore_errors=True)
        return record
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise


def _install(
    spec: str,
    source: Source,
    directory: Path,
    *,
    extras: list[str],
    envs: dict[str, str],
    options: dict[str, Any],
    datasets: dict[str, str],
    dataset_options: dict[str, Any],
    policies: dict[str, str],
    stateless: bool | Collection[str],
    python: str,
    constraints: Path | None,
    say: Say,
) -> PackageRecord:
    venv = directory / "venv"
    say(f"creating a venv for {spec} in {directory}")
    _run([python, "-m", "venv", str(venv)], "creating the venv")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    target = spec
    if source in {"directory", "git", "wheel"}:
        dist = directory / "dist"
        dist.mkdir()
        if source == "wheel":
            target = str(shutil.copy(Path(spec).expanduser(), dist))
        else:
            say(f"building a wheel of {spec}")
            with tempfile.TemporaryDirectory(prefix="gymflow-env-build-") as scratch:
                built = spec
                if source == "directory":
                    # Built from a copy: pip builds a directory in place, so setuptools would leave build/
                    # and *.egg-info in the user's tree, and a stale build/lib (a module since deleted)
                    # would go into the wheel.
                    copy = Path(scratch) / "src"
                    built = str(shutil.copytree(Path(spec).expanduser(), copy, ignore=_build_leftovers(spec)))
                _run([*pip, "wheel", "--no-deps", "-q", "-w", str(dist), built], f"building {spec}")
            target = str(next(dist.glob("*.whl")))
    say(f"installing {spec}" + (f" with {', '.join(extras)}" if extras else ""))
    report_path = directory / "install-report.json"
    pinned = ["-c", str(constraints)] if constraints is not None else []
    _run([*pip, "install", "-q", "--report", str(report_path), *pinned, target, *extras], f"installing {spec}")
    item = _requested(json.loads(report_path.read_text()), target, source)
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    site = _site_packages(venv)
    distribution = _distribution(site, name)
    record = PackageRecord(
        id=directory.name,
        name=name,
        version=version,
        digest=distribution_digest(distribution),
        spec=spec,
        source=source,
        requirement=f"{name}=={version}" if source == "pypi" else f"dist/{Path(target).name}",
        extras=extras,
        commit=((item.get("download_info") or {}).get("vcs_info") or {}).get("commit_id"),
        python=_run(
            [str(venv / "bin" / "python"), "-c", "import sys; print(sys.version.split()[0])"], "python"
        ).strip(),
        installed_at=store.now(),
        lock=_run([*pip, "freeze", "--all"], "pip freeze").splitlines(),
        envs=[],
    )
    declared = {ep.name: ep.value for ep in distribution.entry_points if ep.group == ENTRY_POINT_GROUP}
    declared.update(envs)
    if not declared:
        raise PackageError(
            f"{name} {version} declares no env (no `{ENTRY_POINT_GROUP}` entry points): name its env class with "
            "--env NAME=module:Class"
        )
    for env_name, env_target in declared.items():
        say(f"checking env {env_name} ({env_target}) in the package's venv")
        decl = EnvDecl(
            name=env_name,
            target=env_target,
            kind="plain",
            options=scoped(options, env_name),
            dataset=datasets.get(env_name, datasets.get("")),
            dataset_options=scoped(dataset_options, env_name),
            policies={k: _absolute(v) for k, v in scoped(policies, env_name).items()},
            stateless=stateless if isinstance(stateless, bool) else env_name in stateless,
        )
        record.envs.append(_described(record, decl))
    for env_decl in record.envs:
        default = env_decl.dataset or KIND_DATASETS.get(env_decl.kind)
        if default is not None:
            say(f"loading {env_decl.name}'s dataset {default}")
            path = dataset_file(record, env_decl, default, env_decl.dataset_options)
            env_decl.tasks = sum(1 for line in path.read_text().splitlines() if line.strip())
    return record


def _check_digest(record: PackageRecord, expected: str | None) -> None:
    if expected is not None and record.digest != expected:
        raise PackageError(
            f"{record.name} {record.version} installed with digest {record.digest}, not the {expected} "
            "it was bundled with: this is not the same code"
        )


def install_bundled(directory: Path, *, python: str | None = None, say: Say = print) -> PackageRecord:
    """Install again, on this node, the env package a training bundle carries in `directory`
    (`env_packages/<name>-<version>/`: its record, lock and wheel; gymflow.activities.bundle): the same
    wheel or requirement, every dependency at its locked version, the same envs, datasets and
    policies, and a refusal if the installed code's digest is not the bundled one."""
    bundled = PackageRecord.model_validate_json((directory / store.RECORD).read_text())
    wheels = sorted(directory.glob("*.whl"))
    lock = directory / "requirements.lock"
    constraints = directory / ".constraints.txt"  # the lock without the package's own (direct URL) line
    constraints.write_text("".join(f"{line}\n" for line in lock.read_text().splitlines() if " @ " not in line))
    return install(
        str(wheels[0]) if wheels else bundled.requirement,
        extras=bundled.extras,
        envs={d.name: d.target for d in bundled.envs},
        options={f"{d.name}:{k}": v for d in bundled.envs for k, v in d.options.items()},
        datasets={d.name: d.dataset for d in bundled.envs if d.dataset},
        dataset_options={f"{d.name}:{k}": v for d in bundled.envs for k, v in d.dataset_options.items()},
        policies={f"{d.name}:{k}": v for d in bundled.envs for k, v in d.policies.items()},
        stateless=[d.name for d in bundled.envs if d.stateless],
        python=python,
        constraints=constraints,
        expect_digest=bundled.digest,
        say=say,
    )


def is_bundled(spec: str) -> bool:
    """Whether `spec` is an env package directory of a training bundle (it holds a `package.json`)."""
    return (Path(spec).expanduser() / store.RECORD).is_file()


def scoped(values: dict[str, Any], env: str) -> dict[str, Any]:
    """The install options that apply to `env`: `KEY` applies to every env of the package,
    `ENV:KEY` to that env alone (and wins over `KEY`)."""
    found = {k: v for k, v in values.items() if ":" not in k}
    found.update({k.split(":", 1)[1]: v for k, v in values.items() if k.startswith(f"{env}:")})
    return found


def _absolute(spec: str) -> str:
    """A `file.py:Class` policy spec with its file made absolute (workers run elsewhere)."""
    path, sep, attr = spec.rpartition(":")
    return f"{Path(path).resolve()}{sep}{attr}" if path.endswith(".py") else spec


def _described(record: PackageRecord, decl: EnvDecl) -> EnvDecl:
    """`decl` with what the bridge says of it (kind, docs, tools, flags), or PackageError."""
    answer = launch.run_one_shot(record, decl.model_copy(update={"kind": ""}), "describe")
    record.framework_versions.update({k: str(v) for k, v in (answer.get("versions") or {}).items()})
    tools = [
        ToolSpec(
            name=t["name"],
            description=t.get("description") or "",
            input_schema=t.get("inputSchema") or {},
            server="env",
        )
        for t in answer.get("tools") or []
    ]
    return decl.model_copy(
        update={
            "kind": answer["kind"],
            "description": answer.get("description") or "",
            "doc": answer.get("doc") or "",
            "system_prompt": answer.get("system_prompt") or "",
            "tools": tools,
            "env_turns": bool(answer.get("env_turns")),
        }
    )


def _build_leftovers(spec: str) -> Callable[[str, list[str]], set[str]]:
    """What earlier builds left in directory `spec` (its top-level build/ and dist/, *.egg-info and
    __pycache__ anywhere), for `shutil.copytree` to leave out; a package's own `build` module stays."""
    top = str(Path(spec).expanduser())

    def ignore(directory: str, names: list[str]) -> set[str]:
        left = {n for n in names if n.endswith(".egg-info") or n == "__pycache__"}
        return left | ({"build", "dist"} & set(names) if directory == top else set())

    return ignore


def _run(command: list[str], what: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        output = (done.stderr or done.stdout).strip()[-3000:]
        raise PackageError(f"{what} failed (exit status {done.returncode}):\n{output}")
    return done.stdout


def _requested(report: dict[str, Any], target: str, source: Source) -> dict[str, Any]:
    """The report's item for `target` (the package, not a `--with` requirement)."""
    items = [i for i in report.get("install", []) if i.get("requested")]
    if source == "pypi":
        match = _NAME.match(target)
        wanted = store.normalise(match.group(1) if match else target)
        found = [i for i in items if store.normalise(i["metadata"]["name"]) == wanted]
    else:
        found = [i for i in items if (i.get("download_info") or {}).get("url", "").endswith(Path(target).name)]
    if not found:
        raise PackageError(f"pip's report does not show {target} installed")
    return dict(found[0])


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages"))
    if not found:
        raise PackageError(f"{venv} has no site-packages")
    return found[0]


def _distribution(site: Path, name: str) -> metadata.Distribution:
    for dist in metadata.distributions(path=[str(site)]):
        if store.normalise(dist.metadata["Name"]) == store.normalise(name):
            return dist
    raise PackageError(f"{name} is not in {site}")


def distribution_digest(distribution: metadata.Distribution) -> str:
    """sha256 over `path,hash` of each file the distribution installed (its RECORD), sorted; files
    that say how it was installed (INSTALLER, direct_url.json, ...) and bytecode left out."""
    lines = []
    for entry in distribution.files or []:
        path = entry.as_posix()
        if entry.hash is None or Path(path).name in _UNHASHED or "__pycache__" in path or path.endswith(".pyc"):
            continue
        lines.append(f"{path},{entry.hash.mode}={entry.hash.value}")
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()
