"""The search env: its MCP server's tools (in memory), rewards, the baselines on a generated dataset."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from gymflow.envs.builtin.math.policy import play
from gymflow.envs.builtin.search.data import validate_task
from gymflow.envs.builtin.search.env import SearchEnv
from gymflow.envs.builtin.search.policy import RetrievePolicy
from gymflow.envs.builtin.search.rewards import search_reward
from gymflow.envs.builtin.search.servers import search as server_module
from gymflow.envs.contract import Message, Task
from gymflow.envs.datagen.corpus import Document, chunk_document, decode_document
from gymflow.envs.datagen.filters import MinHashDedup
from gymflow.envs.datagen.generate import Candidate, offline_draft
from gymflow.envs.errors import DatasetError
from gymflow.envs.policy import NullPolicy

SAMPLE = Path(__file__).parents[3] / "envs" / "builtin" / "search" / "sample_corpus"


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    lines = []
    for file in sorted(SAMPLE.rglob("*")):
        if file.is_file():
            doc = decode_document(file.relative_to(SAMPLE).as_posix(), file.read_bytes())
            assert isinstance(doc, Document)
            lines.append(json.dumps({"id": doc.id, "title": doc.title, "text": doc.text, "sha256": doc.sha256}))
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.asynccontextmanager
async def connected(corpus_file: Path) -> AsyncIterator[Client]:
    """The search server in memory, serving `corpus_file` (an MCP client task-local, as anyio needs)."""
    server_module._state.update(path=corpus_file, corpus=None)
    try:
        async with Client(server_module.server) as client:
            yield client
    finally:
        server_module._state.update(path=None, corpus=None)


def answer(text: str) -> list[Message]:
    return [Message(role="user", content="q"), Message(role="assistant", content=text)]


def test_reward_f1_exact_and_citation() -> None:
    truth = {"answers": ["Elena Marsh"], "doc_ids": ["people/elena-marsh.md"]}
    full = search_reward(answer("<answer>Elena Marsh</answer> <cite>people/elena-marsh.md</cite>"), truth)
    assert full.total == pytest.approx(1.0) and full.components == {"f1": 1.0, "exact_match": 1.0, "citation": 1.0}
    partial = search_reward(answer("<answer>Marsh</answer><cite>towns/x.md</cite>"), truth)
    assert partial.components["f1"] == pytest.approx(2 / 3) and partial.components["citation"] == 0.0
    assert search_reward(answer("Elena Marsh, I think"), truth).total == 0.0  # no answer tag
    assert search_reward(answer("<cite>people/elena-marsh.md</cite>"), truth).total == 0.0  # a citation alone


def test_rows_must_be_search_tasks() -> None:
    good = Task(id="q1", prompt="Who?", ground_truth={"answers": ["x"], "doc_ids": ["d"]}, init_args={"corpus": "c"})
    assert validate_task(good).answers == ["x"]
    for bad in (
        good.model_copy(update={"ground_truth": {"answers": [], "doc_ids": ["d"]}}),
        good.model_copy(update={"ground_truth": "x"}),
        good.model_copy(update={"prompt": [Message(role="user", content="Who?")]}),
        good.model_copy(update={"init_args": {"files": {}}}),
    ):
        with pytest.raises(DatasetError, match="q1"):
            validate_task(bad)


async def test_search_and_read_tools(corpus_file: Path) -> None:
    async with connected(corpus_file) as client:
        await check_tools(client)


async def check_tools(client: Client) -> None:
    found = await client.call_tool("search", {"query": "Which town lies on the River", "k": 3})
    hits = found.structured_content["hits"]
    assert 1 <= len(hits) <= 3 and all(h["score"] > 0 for h in hits)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    top = hits[0]
    read = (
        await client.call_tool("read", {"doc_id": top["doc_id"], "offset": top["offset"], "length": 80})
    ).structured_content
    assert len(read["text"]) <= 80 and read["total_chars"] >= top["offset"]
    assert top["text"].split("\n")[-1][:40] in read["text"] + top["text"]
    unknown = await client.call_tool("read", {"doc_id": "nope.md"})
    assert unknown.is_error and "unknown doc_id" in unknown.content[0].text
    assert (await client.call_tool("search", {"query": "river", "k": 0})).is_error
    assert (await client.call_tool("search", {"query": "zzzqqq"})).structured_content["hits"] == []


def sample_tasks(n: int) -> list[Task]:
    """Offline questions straight from the generator (no workflow): single-hop and bridges."""
    docs = {}
    for file in sorted(SAMPLE.rglob("*")):
        if file.is_file():
            doc = decode_document(file.relative_to(SAMPLE).as_posix(), file.read_bytes())
            assert isinstance(doc, Document)
            docs[doc.id] = doc
    chunks = {c.id: c for d in docs.values() for c in chunk_document(d)}
    by_title = {d.title: d.id for d in docs.values()}
    tasks, dedup = [], MinHashDedup()
    for chunk in chunks.values():
        kinds = [("extractive", [chunk.id])]
        for title, doc_id in by_title.items():
            if title in chunk.text and doc_id != chunk.doc_id:
                kinds.append(("multi_hop", [chunk.id, f"{doc_id}#0"]))
                break
        for kind, ids in kinds:
            candidate = Candidate(id=f"{kind}:{'+'.join(ids)}", type=kind, chunk_ids=ids,  # type: ignore[arg-type]
                                  doc_ids=[i.split("#")[0] for i in ids], split="train")  # fmt: skip
            draft = offline_draft(candidate, [chunks[i] for i in ids])
            if hasattr(draft, "question") and not dedup.duplicate_of(draft.question):
                dedup.add(candidate.id, draft.question)
                truth = {"answers": [draft.answer], "doc_ids": candidate.doc_ids}
                tasks.append(Task(id=candidate.id, prompt=draft.question, ground_truth=truth))
    return tasks[:n]


async def test_retrieve_policy_scores_well_above_null(corpus_file: Path) -> None:
    tasks = sample_tasks(40)
    assert len(tasks) == 40 and any("fills the blank" in str(t.prompt) for t in tasks)
    scores = {}
    async with connected(corpus_file) as client:
        for policy in (RetrievePolicy(), NullPolicy()):
            rewards = [
                search_reward(await play(policy, task, client, max_turns=6), task.ground_truth).total for task in tasks
            ]
            scores[policy.name] = sum(rewards) / len(rewards)
    assert scores["null"] == 0.0
    assert scores["retrieve"] >= 0.4, scores


def test_env_registry_and_policies() -> None:
    from gymflow.envs.registry import env_class

    assert env_class("search") is SearchEnv
    assert SearchEnv.baseline_policy().name == "retrieve" and SearchEnv.baseline_policy("null").name == "null"
    with pytest.raises(ValueError, match="retrieve, reference or null"):
        SearchEnv.baseline_policy("oracle")


def test_the_generated_dataset_is_the_shipped_sample(corpus_file: Path) -> None:
    from gymflow.envs.builtin.search.data import SAMPLE_CORPUS, SAMPLE_CORPUS_URI, local_corpus, read_corpus

    tasks = list(SearchEnv.load_dataset("generated"))
    assert len(tasks) == 80 and len({t.id for t in tasks}) == 80
    splits = [t.metadata["split"] for t in tasks]
    assert splits == sorted(splits, key=lambda s: s != "eval")  # eval first: `--n 32` takes eval questions
    assert [t.id for t in SearchEnv.load_dataset("generated", split="train")] == [
        t.id for t in tasks if t.metadata["split"] == "train"
    ]
    assert len(list(SearchEnv.load_dataset("generated", n=5))) == 5
    with pytest.raises(DatasetError, match="unknown split 'dev'"):
        SearchEnv.load_dataset("generated", split="dev")
    # Every row names the shipped corpus in a way any worker resolves to its own installed copy.
    assert {t.init_args["corpus"] for t in tasks} == {SAMPLE_CORPUS_URI}
    assert local_corpus(SAMPLE_CORPUS_URI) == SAMPLE_CORPUS
    shipped = {d["id"]: d["sha256"] for d in read_corpus(SAMPLE_CORPUS)}
    assert shipped == {d["id"]: d["sha256"] for d in read_corpus(corpus_file)}  # the sample corpus, as it is now
    for task in tasks:
        assert set(validate_task(task).doc_ids) <= set(shipped)
