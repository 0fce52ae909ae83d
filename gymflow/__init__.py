"""gymflow: RL environments for tool-using LLMs, where every rollout is a durable Temporal workflow.

The public API. Import from here, not from the subpackages::

    import gymflow

    client = await gymflow.connect("localhost:7233")
    result = await gymflow.run_rollout(client, gymflow.RolloutInput(...))

Names resolve lazily (PEP 562): ``import gymflow`` costs nothing, and an env module that imports
``gymflow.envs.contract`` (an MCP server process, say) never pulls in the Temporal SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # the environment contract and its wire types (no temporalio)
    "BaseEnv": "gymflow.envs.contract",
    "Task": "gymflow.envs.contract",
    "Message": "gymflow.envs.contract",
    "ToolCall": "gymflow.envs.contract",
    "ToolSpec": "gymflow.envs.contract",
    "ToolResult": "gymflow.envs.contract",
    "Reward": "gymflow.envs.contract",
    "Trajectory": "gymflow.envs.contract",
    "TerminationReason": "gymflow.envs.contract",
    "McpEnv": "gymflow.envs.mcp.env",
    "Harness": "gymflow.envs.harness.env",
    "HarnessEnv": "gymflow.envs.harness.env",
    "Policy": "gymflow.envs.policy",
    "register": "gymflow.envs.registry",
    "env_class": "gymflow.envs.registry",
    "UserError": "gymflow.envs.errors",
    "ToolError": "gymflow.envs.errors",
    "InfraError": "gymflow.envs.errors",
    # rollouts: inputs, results and the client
    "ModelConfig": "gymflow.activities.model",
    "RolloutInput": "gymflow.activities.schema",
    "RolloutOptions": "gymflow.activities.schema",
    "RolloutLimits": "gymflow.activities.schema",
    "RolloutResult": "gymflow.activities.schema",
    "GroupResult": "gymflow.activities.schema",
    "connect": "gymflow.workers.client",
    "start_rollout": "gymflow.workers.sdk.client",
    "run_rollout": "gymflow.workers.sdk.client",
    "run_rollouts": "gymflow.workers.sdk.client",
    "iterate_groups": "gymflow.workers.sdk.groups",
    "rollout_groups": "gymflow.workers.sdk.groups",
    "DifficultyFilter": "gymflow.workers.sdk.curriculum",
    "GroupStats": "gymflow.workers.sdk.curriculum",
    "TaskPool": "gymflow.workers.sdk.curriculum",
    "PolicyChannel": "gymflow.workers.sdk.policy",
    "Session": "gymflow.workers.sdk.sessions",
    "run": "gymflow.workers.sdk.scripts",
    # evaluations, datasets, training runs
    "EvalOptions": "gymflow.workers.sdk.evals",
    "run_eval": "gymflow.workers.sdk.evals",
    "RescoreOptions": "gymflow.workers.sdk.rescore",
    "rescore_batch": "gymflow.workers.sdk.rescore",
    "GenerateOptions": "gymflow.workers.sdk.datasets",
    "run_generate": "gymflow.workers.sdk.datasets",
    "RunConfig": "gymflow.activities.training_schema",
    "load_run_config": "gymflow.workers.sdk.training",
    "start_run": "gymflow.workers.cli.train",
    # running a worker in your own process
    "Settings": "gymflow.workers.config",
    "running_worker": "gymflow.workers.worker",
}

__all__ = [
    "BaseEnv",
    "DifficultyFilter",
    "EvalOptions",
    "GenerateOptions",
    "GroupResult",
    "GroupStats",
    "Harness",
    "HarnessEnv",
    "InfraError",
    "McpEnv",
    "Message",
    "ModelConfig",
    "Policy",
    "PolicyChannel",
    "RescoreOptions",
    "Reward",
    "RolloutInput",
    "RolloutLimits",
    "RolloutOptions",
    "RolloutResult",
    "RunConfig",
    "Session",
    "Settings",
    "Task",
    "TaskPool",
    "TerminationReason",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "Trajectory",
    "UserError",
    "connect",
    "env_class",
    "iterate_groups",
    "load_run_config",
    "register",
    "rescore_batch",
    "rollout_groups",
    "run",
    "run_eval",
    "run_generate",
    "run_rollout",
    "run_rollouts",
    "running_worker",
    "start_rollout",
    "start_run",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gymflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return [*globals(), *__all__]


if TYPE_CHECKING:  # what type checkers and IDEs see
    from gymflow.activities.model import ModelConfig
    from gymflow.activities.schema import (
        GroupResult,
        RolloutInput,
        RolloutLimits,
        RolloutOptions,
        RolloutResult,
    )
    from gymflow.activities.training_schema import RunConfig
    from gymflow.envs.contract import (
        BaseEnv,
        Message,
        Reward,
        Task,
        TerminationReason,
        ToolCall,
        ToolResult,
        ToolSpec,
        Trajectory,
    )
    from gymflow.envs.errors import InfraError, ToolError, UserError
    from gymflow.envs.harness.env import Harness, HarnessEnv
    from gymflow.envs.mcp.env import McpEnv
    from gymflow.envs.policy import Policy
    from gymflow.envs.registry import env_class, register
    from gymflow.workers.cli.train import start_run
    from gymflow.workers.client import connect
    from gymflow.workers.config import Settings
    from gymflow.workers.sdk.client import run_rollout, run_rollouts, start_rollout
    from gymflow.workers.sdk.curriculum import DifficultyFilter, GroupStats, TaskPool
    from gymflow.workers.sdk.datasets import GenerateOptions, run_generate
    from gymflow.workers.sdk.evals import EvalOptions, run_eval
    from gymflow.workers.sdk.groups import iterate_groups, rollout_groups
    from gymflow.workers.sdk.policy import PolicyChannel
    from gymflow.workers.sdk.rescore import RescoreOptions, rescore_batch
    from gymflow.workers.sdk.scripts import run
    from gymflow.workers.sdk.sessions import Session
    from gymflow.workers.sdk.training import load_run_config
    from gymflow.workers.worker import running_worker
