"""gymflow rollouts for TRL's `GRPOTrainer`: a `rollout_func` that plays each prompt row as a gymflow rollout.

    rollouts = GymflowRollouts("math", tasks, settings=Settings(), model=ModelConfig(max_tokens=64))
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(..., num_generations=8),
                          train_dataset=rollouts.dataset(), reward_funcs=[rollouts.reward], rollout_func=rollouts)
    trainer.train()
    rollouts.close()

TRL hands `rollout_func` the prompts of a step, each repeated `num_generations` times in a row
(its sampler's doing). Each run of one prompt is a GRPO group: one `GroupRolloutWorkflow` of that
many samples, multi-turn with the env's tools, durable like every gymflow rollout. Back come, per row:

* ``prompt_ids``: the first turn's prompt as the model saw it;
* ``completion_ids``: every token after it: the model's turns and the env's (tool results, the
  chat template between turns), exactly as sampled and fed (gymflow's token mode; nothing is
  re-tokenised);
* ``env_mask``: 1 on the model's tokens, 0 on the env's (TRL multiplies it into the loss mask);
* ``logprobs``: the sampler's logprob of each model token (0.0 on env tokens);
* ``env_reward`` (for `reward`): the env's reward of the rollout, or None when it was infra-failed.

An infra-failed rollout is never a 0. It is played again (`retries` times, as a fresh rollout of
the same task); one that still fails is masked out: its ``env_mask`` is all 0 and its reward None,
which TRL leaves out of its group's mean and gives advantage 0. Such rows are counted per step
(`StepStats.infra_failed`, logged as ``gymflow/infra_failed``). A rollout whose turns do not extend
each other token for token (a template that re-renders history) is cut to its first consistent
segment and counted (``gymflow/token_cut``).

By default the policy is the trainer's own model, served in this process by
`gymflow.workers.servers.hf_policy.HFPolicyServer` (no copy per step: the next request samples the
weights the optimizer just changed), and the rollouts' tool calls run on an in-process gymflow
worker. Give `model.base_url` to roll out against another server (a vLLM that you sync), and
`worker=False` to use a fleet of `gymflow worker`s instead.

Drift, measured every step: the trainer's own logprobs of the sampled tokens (one forward pass of
the model, as TRL computes them) against the sampler's, mean and max |difference| over model tokens
(``gymflow/logprob_diff_mean``, ``gymflow/logprob_diff_max``).

Runs in a venv with torch, transformers and trl (the trainer's; never gymflow's own install).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import GroupResult, RolloutOptions
from gymflow.envs.contract import Task
from gymflow.workers.client import connect, data_converter
from gymflow.workers.config import Settings, WorkerRole
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.sdk.groups import rollout_groups
from gymflow.workers.sdk.trainer import TrainerSession
from gymflow.workers.trainers.integrations.trl_records import (
    Record,
    StepStats,
    fill_masked_prompts,
    groups_of,
    logprob_drift,
    record_of,
    unwrap,
)
from gymflow.workers.worker import running_worker

T = TypeVar("T")
ROLLOUT_ROLE: tuple[WorkerRole, ...] = ("rollout",)
"""What the in-process worker serves: the rollouts' env and model activities."""
TASK_KEY = "gymflow_task"
"""The key of a dataset prompt's message that names its gymflow task (`GymflowRollouts.dataset`)."""


class LoopThread:
    """An event loop in a thread of its own: TRL calls `rollout_func` synchronously, and gymflow's
    clients, worker and served model live in this loop from the first call to `close`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="gymflow-trl", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


class GymflowRollouts:
    """TRL's `rollout_func` (this object, called) and its reward function (`reward`), over gymflow.

    Args:
        env: The gymflow env (a registered name or an env file).
        tasks: The tasks the prompts come from (`dataset` makes TRL's dataset of them).
        settings: How to reach Temporal and, with `worker`, the in-process worker's settings.
        model: How rollouts call the model. Its `base_url` None: the trainer's model, served here.
            Token data and the hermes tool format are forced on (`tokens="vllm"`, `tool_format="hermes"`).
        options: Budgets and retries of every rollout (its `model` is replaced by `model`).
        worker: Run a gymflow worker in this process for the rollouts (else a fleet must poll the queue);
            by default one runs unless `session` is given (a run's rollouts go to the run's workers).
        retries: Times an infra-failed rollout is played again before its row is masked out.
        measure_drift: Compare the trainer's logprobs of every sampled token with the sampler's, per step.
        max_batch: Requests the served model generates together, at most.
        session: A trainer's session (gymflow.workers.sdk.trainer): groups run as the run's (its queue,
            GymflowRun), on the run's workers.
        loop: The event loop thread to use (the session's); by default one of its own.
        client: A Temporal client of that loop to use (else one is connected with `settings`).
    """

    def __init__(
        self,
        env: str,
        tasks: Sequence[Task],
        *,
        settings: Settings | None = None,
        model: ModelConfig | None = None,
        options: RolloutOptions | None = None,
        worker: bool | None = None,
        retries: int = 1,
        measure_drift: bool = True,
        max_batch: int = 64,
        batch_prefix: str | None = None,
        session: TrainerSession | None = None,
        loop: LoopThread | None = None,
        client: Any = None,
    ) -> None:
        if not tasks:
            raise ValueError("GymflowRollouts needs at least one task")
        self.env = env
        self.tasks = list(tasks)
        self.settings = settings or Settings()
        self.model = (model or ModelConfig()).model_copy(update={"tokens": "vllm", "tool_format": "hermes"})
        self.options = options or RolloutOptions()
        self.worker = session is None if worker is None else worker
        self.session = session
        self.retries = retries
        self.measure_drift = measure_drift
        self.max_batch = max_batch
        self.batch_prefix = batch_prefix or f"trl-{uuid.uuid4().hex[:8]}"
        self.history: list[StepStats] = []
        """Every call's stats, in order."""
        self._by_id = {task.id: task for task in self.tasks}
        if len(self._by_id) != len(self.tasks):
            raise ValueError("task ids must be unique")
        self._by_prompt: dict[str, Task] = {}
        for task in self.tasks:
            if isinstance(task.prompt, str):
                self._by_prompt.setdefault(task.prompt, task)
        self._loop: LoopThread | None = loop
        self._owns_loop = loop is None
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = session.client if session is not None else client
        self._server: Any = None
        self._calls = 0

    # -- TRL's side ------------------------------------------------------------------------------

    def dataset(self) -> Any:
        """TRL's train dataset: one conversational prompt per task, naming its task (`TASK_KEY`)."""
        from datasets import Dataset

        rows = []
        for task in self.tasks:
            messages = [{"role": m.role, "content": m.content} for m in task.opening_messages()]
            messages[0][TASK_KEY] = task.id
            rows.append({"prompt": messages})
        return Dataset.from_list(rows)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's `rollout_func(prompts, trainer)`."""
        self._start(trainer)
        assert self._loop is not None
        size = int(getattr(trainer, "num_generations", 1) or 1)
        spans = groups_of(prompts, size)
        tasks = [self.task_of(prompts[start]) for start, _ in spans]
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        self.model = self.model.model_copy(update={"version": step})  # every turn records the step's weights
        self._calls += 1
        batch_id = f"{self.batch_prefix}-step{step:06d}-{self._calls:04d}"
        records, stats = self._loop.run(self._play(tasks, size, batch_id))
        stats.rows, stats.groups = len(records), len(spans)
        if self.measure_drift:
            stats.logprob_diff_mean, stats.logprob_diff_max = logprob_drift(trainer, records, self.model.temperature)
        self.history.append(stats)
        return {
            "prompt_ids": [r.prompt_ids for r in records],
            "completion_ids": [r.completion_ids for r in records],
            "env_mask": [r.env_mask for r in records],
            "logprobs": [r.logprobs for r in records],
            "env_reward": [r.reward for r in records],
            "gymflow_rollout_id": [r.rollout_id for r in records],
        }

    def reward(self, completions: list[Any], env_reward: list[float | None], **kwargs: Any) -> list[float | None]:
        """TRL's reward function: the env's reward of each row (None: infra-failed, left out)."""
        del completions
        log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
        if log_metric is not None and self.history:
            for name, value in self.history[-1].scalars().items():
                log_metric(name, value)
        return list(env_reward)

    def task_of(self, prompt: Any) -> Task:
        """The task a dataset prompt was made from: the task its message names, else its text's task.

        Raises:
            KeyError: The prompt is none of this object's tasks.
        """
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        for message in messages:
            if isinstance(message, dict) and message.get(TASK_KEY) in self._by_id:
                return self._by_id[message[TASK_KEY]]
        users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        text = users[-1] if users else None
        if isinstance(text, str) and text in self._by_prompt:
            return self._by_prompt[text]
        raise KeyError(f"a prompt that is none of the {len(self.tasks)} tasks: {str(prompt)[:120]}")

    # -- gymflow's side --------------------------------------------------------------------------

    def _start(self, trainer: Any) -> None:
        if self._stack is not None:
            return
        if self._loop is None:
            self._loop = LoopThread()
        try:
            self._loop.run(self._open(trainer))
        except BaseException:
            self.close()
            raise

    async def _open(self, trainer: Any) -> None:
        self._stack = contextlib.AsyncExitStack()
        if self._client is None:
            self._client = await connect(
                connection=self.settings.temporal_connection(), data_converter=data_converter(self.settings)
            )
        if self.worker:
            await self._stack.enter_async_context(running_worker(self._client, self.settings, roles=ROLLOUT_ROLE))
        if self.model.base_url is None:
            from gymflow.workers.servers.hf_policy import HFPolicyServer

            model = unwrap(trainer)
            name = self.model.model or "policy"
            self._server = HFPolicyServer(
                trainer.processing_class, lambda requested: model if requested in {name, ""} else None,
                max_batch=self.max_batch, names=lambda: [name],
            )  # fmt: skip
            await self._stack.enter_async_context(self._server)
            self.model = self.model.model_copy(update={"base_url": self._server.url, "model": name})

    async def _play(self, tasks: list[Task], size: int, batch_id: str) -> tuple[list[Record], StepStats]:
        stats = StepStats()
        results: dict[str, GroupResult] = {}
        if self.session is not None:
            groups = self.session.groups(tasks, n=size, model=self.model, concurrency=len(tasks), batch_id=batch_id)
        else:
            groups = rollout_groups(
                self._client, tasks, env=self.env, n=size, model=self.model, options=self.options,
                batch_id=batch_id, max_in_flight=len(tasks), task_queue=self.settings.task_queue,
            )  # fmt: skip
        async for group in groups:
            results[group.group_id] = group
        ordered = [results[gid] for gid in sorted(results)]  # group ids carry the task's index (zero-padded)
        records: list[Record] = []
        for task, group in zip(tasks, ordered, strict=True):
            for sample in group.trajectories:
                played = sample
                for attempt in range(self.retries):
                    if not played.infra_failed:
                        break
                    stats.replayed += 1
                    again = self.options.rollout(self.env, task, batch_id=batch_id, model=self.model)
                    again = again.model_copy(update={"rollout_id": f"{sample.rollout_id}-again{attempt + 1}"})
                    played = await run_rollout(self._client, again, task_queue=self._task_queue)
                record = record_of(played)
                stats.infra_failed += record.reward is None
                stats.token_cut += record.cut
                stats.rollout_ids.append(record.rollout_id)
                records.append(record)
        fill_masked_prompts(records, size)
        return records, stats

    @property
    def _task_queue(self) -> str:
        return self.session.spec.task_queue if self.session is not None else self.settings.task_queue

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` in this object's event loop (where its clients live) and return its result."""
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop.run(coroutine)

    def close(self) -> None:
        """Stop the served model and the worker (rollouts in flight are left to Temporal)."""
        if self._loop is None:
            return
        if self._stack is not None:
            with contextlib.suppress(Exception):
                self._loop.run(self._stack.aclose())
        if self._owns_loop:
            self._loop.close()
            self._loop = None
        self._stack = self._server = None

    def __enter__(self) -> GymflowRollouts:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
