"""The refund desk: an env with a simulated user, its agent and its tasks (tests/workflows/test_user_turns.py,
and the worker process tests/users_worker.py that the kill test runs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from gymflow.envs.contract import BaseEnv, Message, Reward, Task, ToolResult, ToolSpec
from gymflow.envs.policy import Policy
from gymflow.envs.registry import register
from gymflow.envs.users import STOP, ModelUser, ScriptedUser, UserSimulator, UserTurns

NUMBER = re.compile(r"order (\d+)")


# --8<-- [start:env]


def customer(instruction: str, conversation: Sequence[Message]) -> str:
    """The refund customer: gives its order number when asked, stops once refunded."""
    order = NUMBER.search(instruction).group(1)  # type: ignore[union-attr]
    last = conversation[-1].content.lower()
    if f"refunded order {order}" in last:
        return STOP
    if "order number" in last:
        return f"It is order {order}."
    return "I still want my refund."


class RefundDesk(UserTurns, BaseEnv):
    """No tools: the agent must ask for the order number, then refund that order."""

    name = "refund-desk"
    stateless = True  # no tools; a re-init elsewhere gets the user's instruction from the task again
    user: ClassVar[UserSimulator | None] = ScriptedUser(customer)
    max_user_turns = 4

    async def list_tools(self) -> list[ToolSpec]:
        return []

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
        raise NotImplementedError

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        said = " ".join(m.content for m in completion if m.role == "assistant").lower()
        return Reward.of({"refunded": float(f"refunded order {ground_truth}" in said)})


register(RefundDesk.name, RefundDesk)
# --8<-- [end:env]


class ModelRefundDesk(RefundDesk):
    """The same desk with a model playing the user (each test gives it its endpoint)."""

    name = "refund-desk-model"
    user = ModelUser(attempts=2, timeout_s=10)  # GYMFLOW_USER_URL: each test gives its endpoint


register(ModelRefundDesk.name, ModelRefundDesk)


class Agent(Policy):
    """Asks for the order number, then refunds the order the user named."""

    name = "agent"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        found = NUMBER.search(messages[-1].content)
        if found:
            return Message(role="assistant", content=f"Refunded order {found.group(1)}.")
        return Message(role="assistant", content="Sure. What is your order number?")


class Guesser(Policy):
    """Refunds without asking: it cannot know the order."""

    name = "guesser"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        return Message(role="assistant", content="Refunded order 1.")


# --8<-- [start:task]
def task(order: int) -> Task:
    return Task(
        id=f"refund-{order}",
        prompt="Hi, I would like a refund.",
        ground_truth=order,
        init_args={"user": f"You want a refund for your order {order}. Give the number only when asked."},
    )


# --8<-- [end:task]


def start_users_worker(
    *, address: str, queue: str, user_url: str, data_dir: Path, workspace_root: Path, log: Path
) -> subprocess.Popen[bytes]:
    """A worker process (tests/users_worker.py: the built-in envs and the refund desks) on a node of its
    own, its user simulator at `user_url`, in a session of its own (what the kill tests kill)."""
    env = {
        **os.environ,
        "GYMFLOW_TEMPORAL_ADDRESS": address,
        "GYMFLOW_TASK_QUEUE": queue,
        "GYMFLOW_NODE_ID": f"node-{uuid.uuid4().hex[:6]}",
        "GYMFLOW_DATA_DIR": str(data_dir),
        "GYMFLOW_WORKSPACE_ROOT": str(workspace_root),
        "GYMFLOW_WORKER_ROLES": "rollout",
        "GYMFLOW_USER_URL": user_url,
    }
    out = log.open("ab")
    try:
        return subprocess.Popen([sys.executable, str(Path(__file__).with_name("users_worker.py"))], env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
    finally:
        out.close()
