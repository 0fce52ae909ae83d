"""`gymflow dataset generate`, `gymflow dataset show` and `gymflow eval search --dataset URI` as a user runs them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from town_corpus import write_corpus

from gymflow.envs.datagen import format as fmt

SAMPLE = Path(__file__).parents[2] / "envs" / "builtin" / "search" / "sample_corpus"


def gymflow(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gymflow.workers.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)


def generate(out: Path, server: list[str], cwd: Path) -> dict[str, object]:
    run = gymflow("dataset", "generate", "--source", f"corpus:{SAMPLE}", "--n", "30", "--out", str(out),
                  "--eval-fraction", "0.4", "--json", *server, cwd=cwd)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "30/30 accepted" in run.stderr  # the progress bar
    return json.loads(run.stdout)  # type: ignore[no-any-return]


@pytest.mark.heavy
def test_generate_and_show(temporal_address: str, tmp_path: Path) -> None:
    server = ["--address", temporal_address, "--task-queue", f"cli-{uuid.uuid4().hex[:8]}"]
    out = tmp_path / "qa"
    result = generate(out, server, tmp_path)
    assert result["accepted"] == 30 and result["uri"] == out.as_uri()

    show = gymflow("dataset", "show", str(out), "--json", cwd=tmp_path)
    assert show.returncode == 0, show.stderr
    summary = json.loads(show.stdout)
    assert summary["accepted"] == 30 and sum(summary["splits"].values()) == 30
    assert summary["rejections"] and summary["samples"]["train"]
    text = gymflow("dataset", "show", str(out), cwd=tmp_path).stdout
    assert "rejected" in text and "too_easy/answer_in_top1" in text
    bad = gymflow("dataset", "generate", "--source", "wiki:somewhere", "--n", "3", *server, cwd=tmp_path)
    assert bad.returncode == 2 and "corpus:DIR" in bad.stderr
    missing = gymflow(
        "dataset", "generate", "--source", f"corpus:{tmp_path / 'none'}", "--n", "3", *server, cwd=tmp_path
    )
    last = missing.stderr.strip().splitlines()[-1]  # (the in-process worker logs the failed activity above it)
    assert missing.returncode == 2 and last.startswith("gymflow: ") and "does not exist" in last


@pytest.mark.slow  # 200 documents through the CLI; the generator's questions: tests/envs/datagen
def test_a_plain_corpus_of_200_towns(temporal_address: str, tmp_path: Path) -> None:
    """The issue's case: 200 short articles without links between them beyond twin towns."""
    corpus = tmp_path / "towns"
    write_corpus(corpus, 200, flat=True)
    server = ["--address", temporal_address, "--task-queue", f"cli-{uuid.uuid4().hex[:8]}"]
    source = ["dataset", "generate", "--source", f"corpus:{corpus}"]

    def splits_of(out: Path) -> dict[str, set[str]]:
        found = {split: fmt.tasks_from_jsonl((out / f"{split}.jsonl").read_bytes()) for split in fmt.SPLITS}
        return {split: {d for t in tasks for d in t.metadata["doc_ids"]} for split, tasks in found.items()}

    # Defaults: 200 questions with every filter on, in both splits, no document on both sides.
    met = gymflow(*source, "--n", "200", "--out", str(tmp_path / "met"), "--json", *server, cwd=tmp_path)
    assert met.returncode == 0, met.stderr[-3000:]
    result = json.loads(met.stdout)
    assert result["accepted"] == 200 and all(result["splits"].values())
    docs = splits_of(tmp_path / "met")
    assert docs["train"] and docs["eval"] and not docs["train"] & docs["eval"]
    assert "bm25s" not in met.stderr and "Building index" not in met.stderr  # third-party debug lines
    # More than the corpus holds: the summary names what rejected most and how to relax it.
    short = gymflow(*source, "--n", "1000", "--out", str(tmp_path / "short"), *server, cwd=tmp_path)
    assert short.returncode == 1, short.stderr[-3000:]
    lines = short.stdout.splitlines()
    assert re.match(r"accepted \d+ of the 1000 wanted: the source ran out", lines[1]), short.stdout
    assert lines[2].split()[1] == "too_easy/answer_in_top1:" and "--skip-filter too_easy" in lines[2]
    assert int(lines[2].split()[0]) >= int(lines[3].split()[0])  # the most rejecting first
    show = gymflow("dataset", "show", str(tmp_path / "short"), cwd=tmp_path).stdout
    assert "too_easy/answer_in_top1: the answer is in the top BM25 passage" in show and "--skip-filter too_easy" in show
    # The filter skipped: at least 200 rows, both splits, no document on both sides.
    skipped = gymflow(*source, "--n", "200", "--skip-filter", "too_easy", "--out", str(tmp_path / "all"), "--json",
                      *server, cwd=tmp_path)  # fmt: skip
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    result = json.loads(skipped.stdout)
    assert result["accepted"] >= 200 and result["splits"]["train"] and result["splits"]["eval"]
    assert "too_easy/answer_in_top1" not in result["rejections"]
    docs = splits_of(tmp_path / "all")
    assert docs["train"] and docs["eval"] and not docs["train"] & docs["eval"]
    bad = gymflow(*source, "--n", "5", "--skip-filter", "guard", *server, cwd=tmp_path)
    assert bad.returncode == 2 and "invalid choice: 'guard'" in bad.stderr


@pytest.mark.slow  # ~70 s on the busy 2-core box: two batches of real search rollouts
def test_eval_search_on_a_generated_dataset(temporal_address: str, tmp_path: Path) -> None:
    server = ["--address", temporal_address, "--task-queue", f"cli-{uuid.uuid4().hex[:8]}"]
    out = tmp_path / "qa"
    generate(out, server, tmp_path)
    evaluation = gymflow("eval", "search", "--dataset", str(out), "--policy", "retrieve", "--baseline", "null",
                         "--n", "6", "--reps", "200", "--out", str(tmp_path / "report"), "--json", *server,
                         cwd=tmp_path)  # fmt: skip
    assert evaluation.returncode == 0, evaluation.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["policy"]["infra_failed"] == 0 and report["baseline"]["mean"]["value"] == 0.0
    assert report["policy"]["mean"]["value"] > 0.2
