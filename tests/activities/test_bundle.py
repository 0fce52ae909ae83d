"""What a run ships: a reproducible env sdist with pinned requirements, and validated dataset
splits from a dataset directory (local or S3) or the env's own loader."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import boto3
import pytest
from temporalio.testing import ActivityEnvironment

from gymflow.activities.bundle import build_bundle, pinned_requirements, read_splits, sha256
from gymflow.activities.storage import LoadTasksInput, StorageActivities
from gymflow.activities.training_schema import DatasetConfig
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.contract import Task
from gymflow.envs.datagen.format import to_jsonl
from gymflow.envs.errors import DatasetError


def test_the_env_bundle_is_reproducible_and_installable_as_an_sdist() -> None:
    first, second = build_bundle("math"), build_bundle("math")
    assert first.data == second.data and first.digest == second.digest == sha256(first.data)
    with tarfile.open(fileobj=io.BytesIO(first.data)) as tar:
        names = tar.getnames()
        root = names[0].split("/")[0]
        assert root.startswith("gymflow_env_math-")
        files = {n.removeprefix(root + "/"): tar.extractfile(n).read() for n in names}  # type: ignore[union-attr]
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())
    assert {
        "pyproject.toml",
        "PKG-INFO",
        "requirements.txt",
        "MANIFEST.json",
        "gymflow/envs/builtin/math/env.py",
    } <= set(files)
    requirements = files["requirements.txt"].decode().splitlines()
    assert requirements == first.requirements and all("==" in r for r in requirements)
    assert any(r.startswith("pydantic==") for r in requirements)
    manifest = json.loads(files["MANIFEST.json"])
    assert manifest["files"]["gymflow/envs/builtin/math/env.py"] == sha256(files["gymflow/envs/builtin/math/env.py"])
    assert not any(n.endswith((".pkl", ".pickle", ".pyc")) for n in files)


def test_pinned_requirements_follow_the_installed_closure() -> None:
    pins = dict(r.split("==") for r in pinned_requirements("gymflow"))
    assert "temporalio" in pins and "pydantic-core" in pins  # a requirement of a requirement
    assert "pytest" not in pins  # the dev extra is not a runtime requirement


async def test_an_env_dataset_splits_are_validated() -> None:
    splits = await read_splits(DatasetConfig(uri="generated", train={"n": 5, "seed": 1}, eval={"n": 3}), "math")
    assert (len(splits.train), len(splits.eval)) == (5, 3) and splits.source["name"] == "generated"
    with pytest.raises(DatasetError, match=r"no-such\.jsonl"):
        await read_splits(DatasetConfig(uri="no-such.jsonl"), "math")


def write_dataset(directory: Path, env: str = "math", eval_rows: bytes | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "manifest.json").write_text(json.dumps({"env": env, "train": 4, "eval": 2}))
    (directory / "train.jsonl").write_bytes(to_jsonl(generate_tasks(4, seed=3)))
    (directory / "eval.jsonl").write_bytes(eval_rows or to_jsonl(generate_tasks(2, seed=4)))


async def test_a_dataset_directory_from_the_dataset_workflow(tmp_path: Path) -> None:
    write_dataset(tmp_path / "ds")
    splits = await read_splits(DatasetConfig(uri=str(tmp_path / "ds")), "math")
    assert [t.id for t in splits.train] == [t.id for t in generate_tasks(4, seed=3)]
    assert splits.source["manifest"]["env"] == "math"
    with pytest.raises(DatasetError, match=r"for env .math., the run.s env is .units."):
        await read_splits(DatasetConfig(uri=(tmp_path / "ds").as_uri()), "units")
    write_dataset(tmp_path / "bad", eval_rows=b'{"id": "a", "prompt": "x"}\n{"id": "b"}\n')
    with pytest.raises(DatasetError, match=r"eval.jsonl:2: field 'prompt'"):
        await read_splits(DatasetConfig(uri=str(tmp_path / "bad")), "math")
    (tmp_path / "bad" / "train.jsonl").unlink()
    with pytest.raises(DatasetError, match=r"no train\.jsonl"):
        await read_splits(DatasetConfig(uri=str(tmp_path / "bad")), "math")


async def test_an_s3_dataset_prefix_and_its_uploaded_split(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="data")
    write_dataset(tmp_path / "ds")
    for name in ("manifest.json", "train.jsonl", "eval.jsonl"):
        s3.put_object(Bucket="data", Key=f"sets/ds1/{name}", Body=(tmp_path / "ds" / name).read_bytes())
    splits = await read_splits(DatasetConfig(uri="s3://data/sets/ds1"), "math", s3_endpoint_url=s3_endpoint)
    assert len(splits.train) == 4 and len(splits.eval) == 2
    # A batch reads an uploaded split (Task JSONL) page by page through load_tasks.
    storage = StorageActivities(default_uri="s3://data", s3_endpoint_url=s3_endpoint)
    page = await ActivityEnvironment().run(
        storage.load_tasks, LoadTasksInput(env="math", dataset="s3://data/sets/ds1/train.jsonl", offset=1, limit=2)
    )
    assert [t.id for t in page] == [t.id for t in splits.train[1:3]] and all(isinstance(t, Task) for t in page)
