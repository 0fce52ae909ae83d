"""What a training run ships to its trainer: the env as an sdist with pinned requirements, and the
dataset splits as Task JSONL, each with a content digest.

Design decisions:

* The bundle is a plain, installable sdist (`pip install -c requirements.txt BUNDLE`): the env's
  top-level package (for built-in envs, gymflow's `envs`, which never imports temporalio) or an env
  file with the files it names, a generated `pyproject.toml`, `requirements.txt` (the closure of
  the providing distribution's requirements, pinned to the versions installed here) and
  `MANIFEST.json` (sha256 of every file). It is built byte for byte reproducibly (sorted entries,
  fixed mtimes, owners and modes, gzip without a timestamp), so its sha256 is a content digest: the
  same env gives the same digest on every worker, which keys its storage location.
* Env packages (gymflow.envs.packages) travel inside the bundle, the run env's own and every one
  the run config pins (`env_packages`): `env_packages/<name>-<version>/` holds the install's record
  (`package.json`: spec, digest, envs, datasets, policies), its `requirements.lock` (`pip freeze` of
  its venv) and its wheel when it was not installed from an index. On a node,
  `gymflow envs install <bundle>/env_packages/<name>-<version>` installs exactly that again, and
  refuses code whose digest differs.
* Nothing is ever pickled: bundles are tar/JSON/TOML, datasets JSONL, checkpoints JSON.
* Datasets: a directory or prefix written by the dataset workflow (`manifest.json` naming the env,
  `train.jsonl`, `eval.jsonl`), or a name the env's own `load_dataset` understands. Either way every
  row is validated as an `gymflow.envs.contract.Task`, and the splits are re-written canonically, so their
  digest depends on the tasks only.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gymflow.activities.storage import Store, open_store
from gymflow.activities.training_schema import DatasetConfig
from gymflow.envs.contract import Task
from gymflow.envs.datagen.format import tasks_from_jsonl
from gymflow.envs.errors import BundleError, DatasetError, StorageError
from gymflow.envs.packages.env import PackageEnv
from gymflow.envs.packages.store import RECORD, PackageRecord, bundled_name, find_package
from gymflow.envs.registry import env_class, is_env_file

BUNDLED_PACKAGES = "env_packages"
"""The bundle's directory of env packages."""
DATA_SUFFIXES = {".py", ".yaml", ".yml", ".json", ".jsonl", ".txt", ".md", ".toml", ".csv"}
_REQUIREMENT_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass
class Bundle:
    filename: str
    data: bytes
    digest: str
    """sha256 of `data`."""
    requirements: list[str]
    files: dict[str, str]
    """Path in the archive -> sha256 of its content."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_requirements(distribution: str) -> list[str]:
    """`name==version` for the distribution's requirements and theirs, as installed here.

    Requirements behind an `extra` marker are left out; ones that are not installed (a marker
    for another platform) too.
    """
    pins: dict[str, str] = {}
    todo = [distribution]
    while todo:
        try:
            dist = importlib.metadata.distribution(todo.pop())
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in dist.requires or []:
            if "extra ==" in requirement.replace("extra==", "extra =="):
                continue
            match = _REQUIREMENT_NAME.match(requirement)
            if not match:
                continue
            name = _normalise(match.group(1))
            if name in pins:
                continue
            try:
                pins[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
            todo.append(name)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def _package_files(root: Path, prefix: str) -> dict[str, bytes]:
    files = {}
    # followlinks: in a checkout, gymflow/ reaches its subpackages through symlinks (see pyproject)
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            path = Path(folder) / name
            if path.suffix in DATA_SUFFIXES and path.is_file():
                files[f"{prefix}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    return dict(sorted(files.items()))


def env_files(env: str) -> tuple[str, dict[str, bytes]]:
    """(providing distribution, {archive path: content}) of the env's code.

    Raises:
        BundleError: The env's package or file cannot be read.
    """
    cls = env_class(env)
    if is_env_file(env):
        path = Path(getattr(cls, "env_file", env))
        files = {f"env/{path.name}": path.read_bytes()}
        for sibling in sorted(path.parent.iterdir()):
            if sibling.is_file() and sibling.suffix in {".py", ".jsonl"} and sibling.name in path.read_text():
                files[f"env/{sibling.name}"] = sibling.read_bytes()
        return "gymflow", files
    top = cls.__module__.split(".")[0]
    spec = importlib.util.find_spec(top)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise BundleError(f"env {env!r}: cannot find the files of its package {top!r}")
    distributions = importlib.metadata.packages_distributions().get(top) or ["gymflow"]
    return distributions[0], _package_files(Path(locations[0]), top)


def env_package_files(records: Sequence[PackageRecord]) -> dict[str, bytes]:
    """`env_packages/<name>-<version>/` of each install: its record, lock and wheel (see the docstring)."""
    files: dict[str, bytes] = {}
    for record in records:
        prefix = f"{BUNDLED_PACKAGES}/{bundled_name(record)}"
        files[f"{prefix}/{RECORD}"] = record.model_dump_json(indent=1).encode()
        files[f"{prefix}/requirements.lock"] = "".join(f"{line}\n" for line in record.lock).encode()
        for wheel in sorted((record.directory / "dist").glob("*.whl")):
            files[f"{prefix}/{wheel.name}"] = wheel.read_bytes()
    return files


def bundled_records(env: str, pins: Mapping[str, str] | None) -> list[PackageRecord]:
    """The env packages a bundle of `env` carries: the env's own (if it is one) and each pinned one.

    Raises:
        BundleError: A pinned version is not installed here.
    """
    cls = env_class(env)
    records = [cls.record] if issubclass(cls, PackageEnv) else []
    for name, wanted in (pins or {}).items():
        found = find_package(name, wanted.removeprefix("==").strip())
        if not found:
            raise BundleError(f"env_packages: {name} {wanted} is not installed here")
        if found[-1].id not in {r.id for r in records}:
            records.append(found[-1])
    return records


def build_bundle(env: str, env_packages: Mapping[str, str] | None = None) -> Bundle:
    """The env as a reproducible sdist, with the env packages it needs (see the module docstring)."""
    records = bundled_records(env, env_packages)
    cls = env_class(env)
    if cls.package is not None:  # the env's code is its package's wheel, under env_packages/
        distribution, version = cls.package.name, cls.package.version
        files: dict[str, bytes] = {}
        requirements: list[str] = []
    else:
        distribution, files = env_files(env)
        version = _version(distribution)
        requirements = pinned_requirements(distribution)
    files.update(env_package_files(records))
    slug = re.sub(r"[^a-z0-9]+", "_", Path(env).stem.lower()).strip("_") or "env"
    name = f"gymflow_env_{slug}"
    top_packages = sorted({p.split("/")[0] for p in files if p.endswith(".py") and not p.startswith("env/")})
    pyproject = (
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n'
        f'description = "gymflow env {env} ({distribution} {version})"\nrequires-python = ">=3.11"\n'
        f"dependencies = {json.dumps(requirements)}\n\n"
        f"[tool.setuptools.packages.find]\ninclude = {json.dumps([f'{p}*' for p in top_packages] or ['env'])}\n\n"
        '[tool.setuptools.package-data]\n"*" = ["*.yaml", "*.json", "*.jsonl"]\n'
    )
    files = {
        **files,
        "pyproject.toml": pyproject.encode(),
        "requirements.txt": "".join(f"{r}\n" for r in requirements).encode(),
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
    }
    digests = {path: sha256(data) for path, data in sorted(files.items())}
    files["MANIFEST.json"] = json.dumps({"env": env, "files": digests}, indent=1, sort_keys=True).encode()
    root = f"{name}-{version}"
    data = _targz({f"{root}/{path}": content for path, content in files.items()})
    return Bundle(f"{root}.tar.gz", data, sha256(data), requirements, digests)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "0"


def _targz(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files):
            info = tarfile.TarInfo(path)
            info.size = len(files[path])
            info.mtime = 0
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[path]))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


# -- datasets ------------------------------------------------------------------------------------
@dataclass
class Splits:
    train: list[Task]
    eval: list[Task]
    source: dict[str, Any]
    """Where they came from (the dataset's manifest, or the env loader's arguments)."""


def is_dataset_location(uri: str) -> bool:
    """Whether `uri` names a dataset directory/prefix rather than an env dataset name."""
    return uri.startswith(("s3://", "file://")) or Path(uri).is_dir()


async def read_splits(config: DatasetConfig, env: str, *, s3_endpoint_url: str | None = None) -> Splits:
    """The run's train and eval tasks, every row validated.

    Raises:
        DatasetError: Missing files, invalid rows, an env mismatch, an empty split.
        StorageError: The dataset's store cannot be reached.
    """
    if is_dataset_location(config.uri):
        store = open_store(config.uri, s3_endpoint_url=s3_endpoint_url)
        manifest = json.loads(await _get(store, "manifest.json", config.uri))
        named = manifest.get("env") or manifest.get("env_name")
        if named is not None and named != env:
            raise DatasetError(f"{config.uri}: the dataset is for env {named!r}, the run's env is {env!r}")
        files = {
            split: (manifest.get("splits") or {}).get(split, {}).get("jsonl") or f"{split}.jsonl"
            for split in ("train", "eval")
        }  # the manifest names its split files (gymflow.envs.datagen.format), relative to the URI
        train = tasks_from_jsonl(await _get(store, files["train"], config.uri), source=store.uri(files["train"]))
        evals = tasks_from_jsonl(await _get(store, files["eval"], config.uri), source=store.uri(files["eval"]))
        splits = Splits(train, evals, {"uri": config.uri, "manifest": manifest})
    else:
        cls = env_class(env)
        try:
            train = [_task(t) for t in cls.load_dataset(config.uri, **config.train)]
            evals = [
                _task(t)
                for t in cls.load_dataset(config.uri, **(config.eval if config.eval is not None else config.train))
            ]
        except DatasetError:
            raise
        except (FileNotFoundError, NotImplementedError, TypeError, ValueError) as exc:
            raise DatasetError(f"dataset {config.uri!r} of env {env}: {exc}") from exc
        splits = Splits(train, evals, {"env": env, "name": config.uri, "train": config.train, "eval": config.eval})
    for name, tasks in (("train", splits.train), ("eval", splits.eval)):
        if not tasks:
            raise DatasetError(f"dataset {config.uri!r}: the {name} split has no tasks")
    return splits


def _task(value: Any) -> Task:
    return value if isinstance(value, Task) else Task.model_validate(value)


async def _get(store: Store, key: str, base: str) -> bytes:
    try:
        return await store.get(store.uri(key))
    except StorageError as exc:
        raise DatasetError(f"dataset {base!r}: no {key} ({exc})") from exc
    except FileNotFoundError as exc:
        raise DatasetError(f"dataset {base!r}: no {key}") from exc
