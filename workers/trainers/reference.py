"""The reference trainer: GRPO on the math env with a small softmax policy, on CPU, in minutes.

`python -m gymflow.workers.trainers.reference` is what the example run config launches
(`gymflow train launch envs/examples/train_math.yaml --wait`). It speaks the trainer contract
through gymflow.workers.sdk.trainer and does what a GPU trainer does, at toy scale:

1. serves its policy (gymflow.envs.builtin.math.learned.SoftmaxPolicy) behind an OpenAI-compatible endpoint on
   127.0.0.1; the request's `model` names a parameter snapshot (`step-000012`), loaded from the
   run's checkpoint storage when it is not in memory. Choices are sampled from those parameters,
   and the reply carries their log-probabilities (`choices[0].logprobs.content`);
2. each step asks gymflow for GRPO groups (`tasks_per_step` tasks x `group_size` samples) played
   by the current snapshot, recovers every trajectory's choices from its messages
   (`gymflow.envs.builtin.math.learned.decisions`), and takes a policy-gradient step: mean over trajectories of
   advantage x grad log-prob. Infra-failed samples (advantage None) are dropped;
   with `algorithm.extra.filter_zero_variance: true`, groups whose samples all got the same reward
   (no gradient) are dropped and replaced by groups of the next tasks, so each step trains on
   `tasks_per_step` groups with signal, and the drops are reported as `groups/...` step scalars
   (`ReferenceSettings` lists the settings, including retiring tasks that are always solved);
   with `asynchronous: true` it generates while it trains instead (`train_async`);
3. every `checkpoint_every` steps (and after the last) writes the parameters as JSON to
   storage and reports the checkpoint with its endpoint, which gymflow evaluates against the
   baseline; it keeps serving until `finish` says every checkpoint is evaluated.

It never sees an answer: ground truth stays in the tasks gymflow scores; only rewards come back.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import numpy as np
from pydantic import Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import GroupResult, PolicyMode
from gymflow.activities.training_schema import CheckpointReport
from gymflow.envs.builtin.math.learned import TOOLS, Decision, SoftmaxParams, SoftmaxPolicy, decisions
from gymflow.envs.contract import Task, Wire
from gymflow.envs.wire import chat
from gymflow.workers.sdk.curriculum import DifficultyFilter, GroupStats, TaskPool
from gymflow.workers.sdk.groups import group_lag
from gymflow.workers.sdk.policy import PolicyChannel
from gymflow.workers.sdk.trainer import TrainerSession
from gymflow.workers.servers.policy import AppServer, estimate_tokens

Resolve = Callable[[str], Awaitable[SoftmaxParams | None]]


class ReferenceSettings(Wire):
    """The reference trainer's own settings (`algorithm.extra`; an unknown key is an error naming it)."""

    filter_zero_variance: bool = False
    """Drop groups whose rewards are all equal and replace them from the next tasks (`DifficultyFilter`)."""
    max_replacements: int | None = Field(default=None, ge=0)
    """With the filter: tasks taken per step beyond `tasks_per_step`, at most (None: 3 x tasks_per_step)."""
    retire_solved_after: int | None = Field(default=None, ge=1)
    """Retire a task once this many of its groups in a row were all solved (`TaskPool`; None: never)."""
    retire_failed_after: int | None = Field(default=None, ge=1)
    """Retire a task once this many of its groups in a row were all failed (None: never)."""

    asynchronous: bool = False
    """Generate while training (`train_async`): groups of `in_flight_steps` steps in flight, each new policy
    announced to the rollouts still running."""
    max_staleness: int = Field(default=1, ge=0)
    """Asynchronous: no step trains on a group whose oldest turn is more than this many versions old."""
    in_flight_steps: int = Field(default=2, ge=1)
    """Asynchronous: groups of this many steps are in flight at once."""
    policy_mode: PolicyMode = "continue"
    """Asynchronous: what running rollouts do when a new policy is announced (`PolicyMode`)."""
    turn_latency_s: float = Field(default=0.0, ge=0)
    """Serve the policy at this many seconds a completion (0.5x to 1.5x, uniformly): a model's generation
    time, for benchmarks at a realistic latency (bench/async_rl.py)."""

    def pool(self) -> TaskPool | None:
        if self.retire_solved_after is None and self.retire_failed_after is None:
            return None
        return TaskPool(retire_solved_after=self.retire_solved_after, retire_failed_after=self.retire_failed_after)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": status}}, status)


def checkpoint_app(resolve: Resolve, names: Callable[[], list[str]], *, latency_s: float = 0.0) -> Starlette:
    """An OpenAI-compatible endpoint serving SoftmaxPolicy snapshots by model name, with logprobs.

    `latency_s` stands in for a real model's generation time: each completion takes between half
    and one and a half times it (uniformly), so rollouts finish in a spread as real ones do."""
    jitter = random.Random(0)

    async def models(request: Request) -> JSONResponse:
        del request
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "gymflow"} for name in names()]
        return JSONResponse({"object": "list", "data": data})

    async def completions(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            parsed = chat.read_request(body.get("messages"), body.get("tools"))
        except (ValueError, AttributeError, RecursionError) as exc:
            return _error(400, f"not a chat completions request: {exc}")
        name = str(body.get("model") or "")
        params = await resolve(name)
        if params is None:
            return _error(404, f"The model `{name}` does not exist.")
        if latency_s > 0:
            await asyncio.sleep(latency_s * jitter.uniform(0.5, 1.5))
        seed = body.get("seed")
        rng = np.random.default_rng(seed if isinstance(seed, int) else None)
        reply, chosen = SoftmaxPolicy(params).act(parsed.messages, parsed.tools, rng)
        wire = chat.assistant_to_wire(reply, parsed.tool_format)
        logprobs: list[dict[str, Any]] = [
            {"token": f"{d.kind}:{d.choice}", "logprob": params.logprob(d), "bytes": None, "top_logprobs": []}
            for d in chosen
        ]
        prompt_tokens = estimate_tokens(parsed.messages, parsed.tools)
        return JSONResponse({
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": name,
            "choices": [{"index": 0, "message": wire, "logprobs": {"content": logprobs},
                         "finish_reason": "tool_calls" if wire.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max(1, len(chosen)),
                      "total_tokens": prompt_tokens + max(1, len(chosen))},
        })  # fmt: skip

    return Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", completions, methods=["POST"]),
        ]
    )


def _checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def _scalars(params: SoftmaxParams, rewards: list[float], failed: int) -> dict[str, float]:
    """Reward of the step, and how the parameters read: P(right tool), P(call while unsolved)."""
    right = [float(params.probabilities(Decision("tool", op, op))[op]) for op in range(len(TOOLS))]
    p_call = 1.0 / (1.0 + math.exp(-float(params.turn @ np.array([1.0, 0.0, 0.0]))))
    return {
        "reward": float(np.mean(rewards)) if rewards else 0.0,
        "rollouts": float(len(rewards)),
        "infra_failed": float(failed),
        "p_right_tool": float(np.mean(right)),
        "p_call": p_call,
    }


def shuffled(tasks: Sequence[Task], rng: np.random.Generator) -> Iterator[Task]:
    """The tasks in shuffled passes, for ever: each step takes what it needs from here."""
    while True:
        yield from (tasks[i] for i in rng.permutation(len(tasks)))


async def _gradient(
    params: SoftmaxParams, groups: AsyncIterator[GroupResult]
) -> tuple[SoftmaxParams, int, list[float], int]:
    """Sum of advantage x grad log-prob over the groups' samples; the samples used, rewards, infra failures."""
    grad, used, rewards, failed = SoftmaxParams.zeros(), 0, [], 0
    async for group in groups:
        for trajectory, advantage in zip(group.trajectories, group.advantages, strict=True):
            if advantage is None:  # infra-failed: dropped, never trained on as reward 0
                failed += 1
                continue
            grad.step(params.grad(decisions(trajectory.messages)), advantage)
            used += 1
        rewards += [r for r in group.rewards if r is not None]
    return grad, used, rewards, failed


async def train(session: TrainerSession, *, out: Any = sys.stdout) -> int:
    """Run the whole training loop of the session's config; returns the exit code."""
    spec = session.spec
    algo = spec.config.algorithm
    settings = ReferenceSettings.model_validate(algo.extra)
    difficulty, pool = (DifficultyFilter() if settings.filter_zero_variance else None), settings.pool()
    tasks = await session.train_tasks()
    rng = np.random.default_rng(algo.seed)
    params = SoftmaxParams.zeros()
    snapshots: dict[str, SoftmaxParams] = {}

    async def resolve(name: str) -> SoftmaxParams | None:
        if name not in snapshots:
            try:  # a snapshot this process did not make (a restarted trainer): JSON from storage
                raw = await session.read(f"{spec.checkpoints}/{name}.json")
                snapshots[name] = SoftmaxParams.from_json(json.loads(raw))
            except Exception:  # not there, or not our format: the endpoint answers 404
                return None
        return snapshots[name]

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    app = checkpoint_app(resolve, lambda: sorted(snapshots), latency_s=settings.turn_latency_s)
    async with AppServer(app, host="127.0.0.1", port=0) as server:

        def endpoint(name: str) -> ModelConfig:
            return spec.config.model.model_copy(update={"base_url": server.url, "model": name})

        async def checkpoint(step: int) -> CheckpointReport:
            name = _checkpoint_name(step)
            uri = await session.write_checkpoint(f"{name}.json", json.dumps(snapshots[name].to_json()).encode())
            return CheckpointReport(name=name, step=step, uri=uri, endpoint=endpoint(name))

        started = time.monotonic()

        async def report(step: int, scalars: dict[str, float], stats: GroupStats | None) -> None:
            """A step's scalars (and, every `checkpoint_every` steps, its checkpoint) to the run."""
            if stats is not None and (difficulty is not None or pool is not None):
                scalars |= stats.scalars()
            scalars["train_s"] = time.monotonic() - started  # training wall time so far (bench/async_rl.py)
            due = step % algo.checkpoint_every == 0 or step == algo.steps
            await session.report(step, scalars, checkpoint=await checkpoint(step) if due else None)
            say(f"step {step}: reward {scalars['reward']:.3f}, P(right tool) {scalars['p_right_tool']:.2f}")
            if stats is not None and (stats.dropped or stats.short or stats.retired):
                say(f"  groups: {stats.summary()}")

        snapshots[_checkpoint_name(0)] = params.copy()
        say(f"run {spec.run_id}: {len(tasks)} train tasks, policy at {server.url}")
        # Step 0 is the starting policy: the run's baseline (`softmax`) is the same policy, so it is
        # reported without a checkpoint to evaluate.
        await session.report(0, _scalars(params, [], 0))
        stream = shuffled(tasks, rng)

        async def learn(step: int, groups: AsyncIterator[GroupResult]) -> dict[str, float]:
            grad, used, rewards, failed = await _gradient(params, groups)
            params.step(grad, algo.lr / max(used, 1))
            snapshots[_checkpoint_name(step)] = params.copy()
            return _scalars(params, rewards, failed)

        if settings.asynchronous:
            await train_async(session, settings, tasks=stream, endpoint=endpoint, learn=learn, report=report)
        else:
            for step in range(1, algo.steps + 1):
                groups = session.groups(
                    stream, model=endpoint(_checkpoint_name(step - 1)), want=algo.tasks_per_step,
                    filter=difficulty, max_replacements=settings.max_replacements, pool=pool,
                )  # fmt: skip
                await report(step, await learn(step, groups), groups.stats)
        say("training done; waiting for the checkpoint evaluations")
        for summary in await session.finish():
            say(f"eval {summary.checkpoint}: mean {summary.mean}, baseline {summary.baseline_mean}, "
                f"P(improvement) {summary.probability_of_improvement}")  # fmt: skip
    return 0


async def train_async(
    session: TrainerSession,
    settings: ReferenceSettings,
    *,
    tasks: Iterator[Task],
    endpoint: Callable[[str], ModelConfig],
    learn: Callable[[int, AsyncIterator[GroupResult]], Awaitable[dict[str, float]]],
    report: Callable[[int, dict[str, float], GroupStats | None], Awaitable[None]],
) -> None:
    """Generate while training: the groups of the next `in_flight_steps - 1` steps play while a step
    waits for its own and trains, and each new policy is announced to the rollouts still running
    (`policy_mode`: they move to it at their next turn, or finish their turn and wait for it).

    Every step trains on all the groups it started (none more than `max_staleness` versions behind the
    policy, the rest played again), not on the first to finish: short episodes finish first, and a
    step that took those would learn from a biased sample (measured: docs/benchmarks.md)."""
    algo = session.spec.config.algorithm
    policy = PolicyChannel(session.client, endpoint(_checkpoint_name(0)).model_copy(update={"version": 0}))
    pending: collections.deque[asyncio.Task[tuple[list[GroupResult], GroupStats]]] = collections.deque()

    async def collect(step: int) -> tuple[list[GroupResult], GroupStats]:
        stream = session.groups(
            tasks, want=algo.tasks_per_step, concurrency=algo.tasks_per_step, batch_id=f"async-{step:06d}",
            policy=policy, max_staleness=settings.max_staleness, policy_mode=settings.policy_mode,
        )  # fmt: skip
        return [group async for group in stream], stream.stats

    def launch(step: int) -> None:
        if step <= algo.steps:
            pending.append(asyncio.create_task(collect(step)))

    for ahead in range(1, settings.in_flight_steps + 1):
        launch(ahead)
    try:
        for step in range(1, algo.steps + 1):
            groups, stats = await pending.popleft()
            lags = [group_lag(group, policy.version) for group in groups]
            scalars = await learn(step, _each(groups))
            scalars |= {"lag_max": float(max(lags, default=0)), "lag_mean": float(np.mean(lags) if lags else 0.0),
                        "stale_rerun": float(stats.stale_rerun)}  # fmt: skip
            scalars |= {f"lag_{lag}": float(lags.count(lag)) for lag in sorted(set(lags))}
            await policy.announce(step, model=endpoint(_checkpoint_name(step)))
            launch(step + settings.in_flight_steps)
            await report(step, scalars, None)
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await policy.cancel_running()  # groups still in flight would train nothing now


async def _each(groups: list[GroupResult]) -> AsyncIterator[GroupResult]:
    for group in groups:
        yield group


async def main() -> int:
    from gymflow.workers import logs

    logs.configure()  # structured log lines on stderr; stdout keeps the trainer's own progress lines
    return await train(await TrainerSession.connect())


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
