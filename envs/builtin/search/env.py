"""The search environment: answer questions over a document collection with BM25 search and a reader.

Tasks come from datasets written by `gymflow dataset generate` (`DatasetGenerationWorkflow`);
each names its dataset's corpus in ``init_args.corpus``. A rollout gets its own search server
(`gymflow.envs.builtin.search.servers.search`) reading that corpus, fetched once per worker into a local cache.
Rewards: token F1 / exact match of the ``<answer>`` and citation of a gold document
(`gymflow.envs.builtin.search.rewards`); with ``SearchEnv(judge=True)`` an LLM judge also scores the answer
against the reference (the rollout's judge settings or the worker's GYMFLOW_JUDGE_URL).
Stateless: the server only reads, so a lost rollout simply gets a fresh one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from gymflow.envs.builtin.search.data import load_sample, load_split, local_corpus
from gymflow.envs.builtin.search.rewards import correctness_rubric, search_reward
from gymflow.envs.builtin.search.servers.search import CORPUS_POINTER
from gymflow.envs.contract import Message, Reward, Task
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.wire.rubric import Rubric

SYSTEM_PROMPT = (
    "You answer questions about a document collection. Use the search tool to find passages and the read "
    "tool to read documents; do not answer from memory. When you are done, reply with the answer as "
    "<answer>SHORT ANSWER</answer> followed by the id of each document you used as <cite>DOC_ID</cite>."
)


class SearchEnv(McpEnv):
    """Question answering over a corpus: search and read tools, F1 + citation reward."""

    name = "search"
    system_prompt = SYSTEM_PROMPT
    stateless = True
    fused_turns = True  # tool calls may re-run: one activity per turn (gymflow.activities.turn)
    offline_reward = True  # the reward reads the final answer alone: stored trajectories can be rescored
    mcp_servers = {"search": {"command": "python", "args": ["-m", "gymflow.envs.builtin.search.servers.search"]}}
    policies = {
        "retrieve": "gymflow.envs.builtin.search.policy:RetrievePolicy",  # retrieve, read, extract
        "reference": "gymflow.envs.builtin.search.policy:RetrievePolicy",
    }

    def __init__(self, *, judge: bool = False, **kwargs: Any) -> None:
        """Args:
        judge: Have an LLM judge score every rollout with `correctness_rubric` too.
        """
        super().__init__(**kwargs)
        self.judge = judge

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        """Stage the task's corpus (``init_args.corpus``: a path, file:// or s3:// URI)."""
        corpus = rollout_args.pop("corpus", None)
        if corpus is not None:
            if not isinstance(corpus, str):
                raise ValueError("search init_args: 'corpus' must be a URI string")
            try:
                path = await asyncio.to_thread(local_corpus, corpus)
            except FileNotFoundError as exc:
                raise ValueError(f"search init_args: {exc}") from exc
            rollout_args["files"] = {**(rollout_args.get("files") or {}), CORPUS_POINTER: str(path)}
        await super().init_rollout(rollout_id, **rollout_args)

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        del rollout_id, kwargs
        return search_reward(completion, ground_truth)

    def rubric(self, task: Task) -> Rubric | None:
        del task
        return correctness_rubric() if self.judge else None

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> Iterable[Task]:
        """``generated``: the sample shipped with gymflow, questions over ``envs/builtin/search/sample_corpus``
        (kwargs: split, default both; n); else a dataset URI written by `gymflow dataset generate`
        (kwargs: split, default ``eval``; n)."""
        if name == "generated":
            split = kwargs.get("split")
            tasks = load_sample(None if split is None else str(split))
        else:
            tasks = load_split(name, str(kwargs.get("split", "eval")))
        n = kwargs.get("n")
        return tasks[: int(n)] if n is not None else tasks
