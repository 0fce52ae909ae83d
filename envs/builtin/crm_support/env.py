"""crm-support: a customer-support desk on the CRM, with a simulated customer and a domain policy.

tau-bench's shape on gymflow's CRM: the agent follows a policy (verify the customer first, act only
on their orders, refund within a limit or escalate, cancel only what has not shipped), a simulated
customer with a goal and private facts (e-mail address, birth date) talks to it
(gymflow.envs.users.UserTurns), and the reward reads the final database and what the agent said
(gymflow.envs.builtin.crm_support.rewards); a policy violation scores 0.

* Each rollout gets a writable copy of the support database (the generated CRM plus refunds,
  escalations and a log of every tool call: gymflow.envs.builtin.crm_support.store) in its
  workspace, and one MCP server process on it. The master of each seed is built once per worker.
* Not stateless (the tools write) but replayable: the tools are deterministic (ids are counted
  per copy), so a rollout whose worker dies gets a fresh copy elsewhere, its recorded tool calls
  run again on it and must give the same results, and the customer gets its instruction from the
  task again. Refused calls are not replayed; they changed nothing (the reward skips them too).
* `crm-support` plays the customer with a script (`ScriptedUser`, offline, deterministic);
  `crm-support-llm` with a model behind any OpenAI-compatible endpoint (`ModelUser`, the URL in
  ``GYMFLOW_USER_URL``). `gymflow policy serve crm-support --policy customer` serves the script as
  such an endpoint.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from gymflow.envs.builtin.crm_support import store
from gymflow.envs.builtin.crm_support.rewards import support_reward
from gymflow.envs.builtin.crm_support.rules import POLICY
from gymflow.envs.builtin.crm_support.server import DB_NAME
from gymflow.envs.builtin.crm_support.tasks import customer_line, generate_tasks
from gymflow.envs.contract import Message, Reward, Task, Unavailable
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.runtime import workspace as ws
from gymflow.envs.users import ModelUser, ScriptedUser, UserSimulator, UserTurns

SERVER_MODULE = "gymflow.envs.builtin.crm_support.server"
DB_DIR = ".crm-support-db"
"""Where, under the workspace root, the env keeps the master database of each seed."""


def _scripted(instruction: str, conversation: Sequence[Message]) -> str:
    return customer_line(instruction, conversation[-1].content if conversation else "")


class CrmSupportEnv(UserTurns, McpEnv):
    """A support desk: verify, look up, refund / escalate / cancel; scored on the final database."""

    name = "crm-support"
    system_prompt = POLICY
    replayable = True  # deterministic tools on a fresh copy rebuild the rollout's database exactly
    mcp_servers = {"support": {"command": "python", "args": ["-m", SERVER_MODULE, "--db", DB_NAME]}}
    user: ClassVar[UserSimulator | None] = ScriptedUser(_scripted)
    max_user_turns = 6
    policies = {
        "reference": "gymflow.envs.builtin.crm_support.policy:ReferenceAgent",
        "customer": "gymflow.envs.builtin.crm_support.policy:CustomerPolicy",  # the user's side, to serve
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._masters: dict[str, Path] = {}

    def master(self, seed: int) -> Path:
        """The support master of `seed` on this worker (built on first use)."""
        return store.master_file(self.workspace_root / DB_DIR, seed)

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        """Start the server and stage a writable copy of the support database of ``db_seed`` (default 0)."""
        seed = rollout_args.pop("db_seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"crm-support init_args: 'db_seed' must be a non-negative integer, got {seed!r}")
        master = await asyncio.to_thread(self.master, seed)
        await super().init_rollout(rollout_id, **rollout_args)
        try:
            await asyncio.to_thread(ws.copy_in, self.workspace(rollout_id), master, DB_NAME)
        except BaseException:
            await self.release_rollout(rollout_id)
            raise
        self._masters[rollout_id] = master

    async def release_rollout(self, rollout_id: str) -> None:
        self._masters.pop(rollout_id, None)
        await super().release_rollout(rollout_id)

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        """Read the rollout's copy (its writes and its log) and score it."""
        del kwargs
        copy = self.workspace(rollout_id) / DB_NAME  # raises RolloutNotFound for a rollout this worker lacks
        master = self._masters.get(rollout_id)
        if master is None:
            raise ValueError(f"rollout {rollout_id!r} has no support database on this worker")
        outcome = await asyncio.to_thread(store.outcome, copy, master)
        return support_reward(outcome, completion, ground_truth)

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> Iterable[Task]:
        """``generated`` (kwargs n: tasks, default 100; seed: database and tasks, default 0)."""
        if name != "generated":
            raise ValueError(f"{cls.name} has only the 'generated' dataset, not {name!r}")
        return generate_tasks(int(kwargs.get("n", 100)), seed=int(kwargs.get("seed", 0)))


USER_URL = "GYMFLOW_USER_URL"


class CrmSupportLlmEnv(CrmSupportEnv):
    """The same desk with a model playing the customer, at the endpoint in ``GYMFLOW_USER_URL``."""

    name = "crm-support-llm"
    user = ModelUser(model="customer", attempts=3, timeout_s=60)

    @classmethod
    def unavailable(cls, **env_kwargs: Any) -> Unavailable | None:
        if not os.environ.get(USER_URL):
            return Unavailable(
                f"no user simulator: {USER_URL} is not set",
                f"serve a model for the customer and export {USER_URL}=http://HOST:PORT/v1 (offline: "
                f"`gymflow policy serve crm-support --policy customer --port 8001` and {USER_URL}=http://127.0.0.1:8001/v1)",
            )
        return super().unavailable(**env_kwargs)
