"""gymflow environments as skyrl-gym environments: `BaseTextEnv` over a trainer-driven session.

SkyRL's generator owns generation and calls ``env.init(prompt)`` once, then ``env.step(text)``
per turn (from a thread pool: the calls are synchronous) and ``env.close()``. Each episode here is
one `RolloutSessionWorkflow`, so the env keeps gymflow's isolation, node pinning and crash recovery
while SkyRL trains. Importing this module registers, with skyrl-gym, ``gymflow`` (env named by
``env_config.env``) and one id per built-in env, ``gymflow-math`` and ``gymflow-sheets``; a SkyRL
config names them as ``environment.env_class``, and ``environment.skyrl_gym.<env_class>`` holds
the `GymflowEnvConfig` fields (the Temporal address and queue default to ``GYMFLOW_*`` settings).

A dataset row for SkyRL comes from `dataset_row`: the prompt SkyRL templates, the ground truth in
``reward_spec``, and the whole gymflow Task in ``extra_info.gymflow_task`` (init args included), so
the episode runs the task exactly; a row without it is made into a Task from its prompt and
``reward_spec.ground_truth``.

What the model sees: `init` returns the env's system prompt with the tools in the hermes format
(the Qwen/Hermes template's ``# Tools`` block) followed by the task's messages; `step` parses the
model's ``<tool_call>`` blocks, and answers with one user message of ``<tool_response>`` blocks.
The reward is the env's own, computed by the session from the conversation as typed messages (the
text SkyRL hands over becomes an assistant `Message`; a reward function never sees a bare string).
An episode the system failed (``infra_failed``: a node lost for good, a model of the env crashed)
still has to return a float to SkyRL: it returns 0.0 with ``metadata["infra_failed"] = True`` and
counts it in `get_metrics`, so a run can drop or at least see them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import Field
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register, registry

from gymflow.activities.schema import RetrySettings, RolloutLimits
from gymflow.activities.session_schema import SessionInput
from gymflow.envs.contract import Message, Task, Trajectory, Wire
from gymflow.envs.wire import chat
from gymflow.workers.config import Settings
from gymflow.workers.sdk.sessions import Session, SyncSessions

ENV_IDS = {"gymflow": None, "gymflow-math": "math", "gymflow-sheets": "sheets"}
"""skyrl-gym ids this module registers, and the gymflow env each plays (None: `env_config.env`)."""


class GymflowEnvConfig(Wire):
    """`environment.skyrl_gym.<env_class>` of a SkyRL config."""

    env: str | None = None
    """The gymflow env (a registered name or an env-file path); the env class's own by default."""
    temporal_address: str | None = None
    """Temporal frontend ``host:port``; default ``GYMFLOW_TEMPORAL_ADDRESS``."""
    namespace: str | None = None
    task_queue: str | None = None
    """The gymflow workers' shared queue; default ``GYMFLOW_TASK_QUEUE``."""
    limits: RolloutLimits = Field(default_factory=RolloutLimits)
    """`max_turns` counts the model's turns; tool budgets and timeouts."""
    retry: RetrySettings = Field(default_factory=RetrySettings)
    idle_timeout_s: float = Field(default=600.0, gt=0)
    """A session the trainer abandons frees its env after this."""
    model: str = ""
    """The policy being trained (GymflowModel search attribute)."""
    run_id: str | None = None
    """The training run (GymflowRun search attribute)."""


_clients: dict[tuple[str, str, str], SyncSessions] = {}
_clients_lock = threading.Lock()


def sync_sessions(address: str, namespace: str, task_queue: str) -> SyncSessions:
    """One session client (and background loop) per process and server, shared by every episode."""
    key = (address, namespace, task_queue)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = SyncSessions(address, namespace=namespace, task_queue=task_queue)
        return _clients[key]


def dataset_row(env: str, task: Task, *, env_class: str | None = None) -> dict[str, Any]:
    """A SkyRL dataset row (parquet-ready dict) for `task` of gymflow env `env`."""
    return {
        "data_source": f"gymflow/{env}",
        "prompt": [{"role": m.role, "content": m.content} for m in task.opening_messages()],
        "env_class": env_class or (f"gymflow-{env}" if f"gymflow-{env}" in ENV_IDS else "gymflow"),
        "reward_spec": {"method": "rule", "ground_truth": task.ground_truth},
        "extra_info": {"gymflow_task": task.model_dump(mode="json"), "task_id": task.id},
    }


class GymflowTextEnv(BaseTextEnv):
    """One episode of a gymflow env, for SkyRL (see the module docstring)."""

    default_env: ClassVar[str | None] = None

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        raw = dict(env_config.items()) if env_config is not None else {}
        self.config = GymflowEnvConfig.model_validate(_plain(raw))
        self.env_name = self.config.env or self.default_env
        if not self.env_name:
            raise ValueError("set environment.skyrl_gym.<env_class>.env to a gymflow env name")
        self.extras = dict(extras or {})
        self.max_turns = self.config.limits.max_turns
        self.session: Session | None = None
        self.tools: list[Any] = []
        self.trajectory: Trajectory | None = None
        self._last: dict[str, Any] = {}
        settings = Settings()
        connection = settings.temporal_connection()  # GYMFLOW_*, TEMPORAL_* and profiles (mTLS, API keys)
        self._sessions = sync_sessions(
            self.config.temporal_address or connection.address,
            self.config.namespace or connection.namespace,
            self.config.task_queue or settings.task_queue,
        )

    def task(self, prompt: Sequence[Mapping[str, Any]]) -> Task:
        """The gymflow Task of this episode: the row's own, or one made from the prompt."""
        extra = self.extras.get("extra_info") or {}
        stored = extra.get("gymflow_task") if isinstance(extra, Mapping) else None
        if stored is not None:
            return Task.model_validate(_plain(stored))
        reward_spec = self.extras.get("reward_spec") or {}
        messages = [Message(role=m["role"], content=chat.content_text(m.get("content"))) for m in prompt]
        task_id = (extra.get("task_id") if isinstance(extra, Mapping) else None) or f"skyrl-{uuid.uuid4().hex[:8]}"
        return Task(id=str(task_id), prompt=messages, ground_truth=_plain(reward_spec.get("ground_truth")))

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Start the session; the model's first input: system prompt with tools, then the task."""
        task = self.task(prompt)
        config = self.config
        self.session = self._sessions.start(
            SessionInput(
                env=self.env_name,
                task=task,
                limits=config.limits,
                retry=config.retry,
                idle_timeout_s=config.idle_timeout_s,
                model=config.model,
                run_id=config.run_id,
            )
        )
        first = self._sessions.run(self.session.reset())
        self.tools = first.tools
        conversation = chat.render_messages(first.messages, first.tools, "hermes")
        return conversation, {"session_id": first.session_id, "task_id": task.id}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Apply the model's text; tool responses, reward (when done), done."""
        if self.session is None:
            raise RuntimeError("init() must be called before step()")
        self.turns += 1
        result = self._sessions.run(self.session.step(text=action))
        observations = chat.render_messages(result.observations, [], "hermes") if result.observations else []
        reward = result.reward.total if result.reward is not None else 0.0
        metadata = {
            "termination": result.termination.value if result.termination else None,
            "infra_failed": result.infra_failed,
            "reward_components": dict(result.reward.components) if result.reward else {},
        }
        if result.error:
            metadata["error"] = result.error
        self._last = metadata
        return BaseTextEnvStepOutput(
            observations=observations, reward=float(reward), done=result.done, metadata=metadata
        )

    def close(self) -> None:
        """End the session; its trajectory is kept in `trajectory`."""
        if self.session is not None:
            self.trajectory = self._sessions.run(self.session.close())
            self.session = None

    def get_metrics(self) -> dict[str, Any]:
        trajectory = self.trajectory
        return {
            "infra_failed": float(bool(self._last.get("infra_failed"))),
            "tool_calls": trajectory.tool_calls if trajectory else 0,
            "recoveries": trajectory.recoveries if trajectory else 0,
            "turns": self.turns,
        }


class GymflowMathEnv(GymflowTextEnv):
    default_env = "math"


class GymflowSheetsEnv(GymflowTextEnv):
    default_env = "sheets"


def _plain(value: Any) -> Any:
    """OmegaConf containers (what SkyRL passes) as plain Python."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - skyrl-gym depends on omegaconf
        return value
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def register_envs() -> None:
    """Register gymflow's skyrl-gym ids (idempotent)."""
    entry = {"gymflow": "GymflowTextEnv", "gymflow-math": "GymflowMathEnv", "gymflow-sheets": "GymflowSheetsEnv"}
    for env_id, name in entry.items():
        if env_id not in registry:
            register(id=env_id, entry_point=f"{__name__}:{name}")


register_envs()
