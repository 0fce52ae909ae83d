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
3. every `checkpoint_every` steps (and after the last) writes the parameters as JSON to
   storage and reports the checkpoint with its endpoint, which gymflow evaluates against the
   baseline; it keeps serving until `finish` says every checkpoint is evaluated.

It never sees an answer: ground truth stays in the tasks gymflow scores; only rewards come back.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import GroupResult
from gymflow.activities.training_schema import CheckpointReport
from gymflow.envs.builtin.math.learned import TOOLS, Decision, SoftmaxParams, SoftmaxPolicy, decisions
from gymflow.envs.contract import Task
from gymflow.envs.wire import chat
from gymflow.workers.sdk.groups import group_lag
from gymflow.workers.sdk.policy import PolicyChannel
from gymflow.workers.sdk.trainer import TrainerSession
from gymflow.workers.servers.policy import AppServer, estimate_tokens

Resolve = Callable[[str], Awaitable[SoftmaxParams | None]]


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


class Learner:
    """The policy being trained and its snapshots (by checkpoint name), one gradient step at a time."""

    def __init__(self) -> None:
        self.params = SoftmaxParams.zeros()
        self.snapshots: dict[str, SoftmaxParams] = {_checkpoint_name(0): self.params.copy()}

    def step(self, step: int, groups: list[GroupResult], lr: float) -> dict[str, float]:
        """A policy-gradient step on `groups` (infra-failed samples dropped); the step's scalars."""
        grad, used, rewards, failed = SoftmaxParams.zeros(), 0, [], 0
        for group in groups:
            for trajectory, advantage in zip(group.trajectories, group.advantages, strict=True):
                if advantage is None:  # infra-failed: dropped, never trained on as reward 0
                    failed += 1
                    continue
                grad.step(self.params.grad(decisions(trajectory.messages)), advantage)
                used += 1
            rewards += [r for r in group.rewards if r is not None]
        self.params.step(grad, lr / max(used, 1))
        self.snapshots[_checkpoint_name(step)] = self.params.copy()
        return _scalars(self.params, rewards, failed)


async def train(session: TrainerSession, *, out: Any = sys.stdout) -> int:
    """Run the whole training loop of the session's config; returns the exit code.

    `algorithm.extra` settings: `async` (generate while training, see `train_async`), `max_staleness`,
    `in_flight_steps` and `policy_mode` for it, and `turn_latency_s`, a model's generation time to serve
    the policy with (default 0)."""
    spec = session.spec
    algo = spec.config.algorithm
    extra = algo.extra
    tasks = await session.train_tasks()
    rng = np.random.default_rng(algo.seed)
    learner = Learner()
    snapshots = learner.snapshots

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

    app = checkpoint_app(resolve, lambda: sorted(snapshots), latency_s=float(extra.get("turn_latency_s", 0.0)))
    async with AppServer(app, host="127.0.0.1", port=0) as server:

        def endpoint(name: str) -> ModelConfig:
            return spec.config.model.model_copy(update={"base_url": server.url, "model": name})

        started = time.monotonic()

        async def report(step: int, scalars: dict[str, float]) -> None:
            scalars["train_s"] = time.monotonic() - started  # wall time of training so far (bench.async_rl)
            due = step % algo.checkpoint_every == 0 or step == algo.steps
            checkpoint = None
            if due:
                name = _checkpoint_name(step)
                uri = await session.write_checkpoint(f"{name}.json", json.dumps(snapshots[name].to_json()).encode())
                checkpoint = CheckpointReport(name=name, step=step, uri=uri, endpoint=endpoint(name))
            await session.report(step, scalars, checkpoint=checkpoint)
            say(f"step {step}: reward {scalars['reward']:.3f}, P(right tool) {scalars['p_right_tool']:.2f}")

        say(f"run {spec.run_id}: {len(tasks)} train tasks, policy at {server.url}")
        # Step 0 is the starting policy: the run's baseline (`softmax`) is the same policy, so it is
        # reported without a checkpoint to evaluate.
        await session.report(0, _scalars(learner.params, [], 0))

        def batches() -> Iterator[Task]:  # the train tasks, reshuffled every epoch, for ever
            while True:
                yield from (tasks[int(i)] for i in rng.permutation(len(tasks)))

        stream = batches()
        if extra.get("async"):
            await train_async(session, learner, stream, endpoint, report)
        else:
            for step in range(1, algo.steps + 1):
                batch = list(itertools.islice(stream, algo.tasks_per_step))
                groups = [g async for g in session.groups(batch, model=endpoint(_checkpoint_name(step - 1)))]
                await report(step, learner.step(step, groups, algo.lr))
        say("training done; waiting for the checkpoint evaluations")
        for summary in await session.finish():
            say(f"eval {summary.checkpoint}: mean {summary.mean}, baseline {summary.baseline_mean}, "
                f"P(improvement) {summary.probability_of_improvement}")  # fmt: skip
    return 0


async def train_async(
    session: TrainerSession,
    learner: Learner,
    tasks: Iterator[Task],
    endpoint: Callable[[str], ModelConfig],
    report: Callable[[int, dict[str, float]], Awaitable[None]],
) -> None:
    """Generate while training: groups of `in_flight_steps` steps are in flight at once, every step
    takes the first `tasks_per_step` groups that finish (none more than `max_staleness` versions behind
    the policy), and each new policy is announced to the rollouts still running (`policy_mode`:
    they move to it at their next turn, or finish their turn and wait for it)."""
    algo = session.spec.config.algorithm
    extra = algo.extra
    mode = extra.get("policy_mode", "continue")
    if mode not in ("continue", "drain"):
        raise ValueError(f"algorithm.extra.policy_mode: 'continue' or 'drain', not {mode!r}")
    policy = PolicyChannel(session.client, endpoint(_checkpoint_name(0)).model_copy(update={"version": 0}))
    in_flight = int(extra.get("in_flight_steps", 2)) * algo.tasks_per_step
    groups = session.groups(
        tasks, model=policy.model, concurrency=in_flight, batch_id="async", policy=policy,
        max_staleness=int(extra.get("max_staleness", 1)), policy_mode=mode,
    )  # fmt: skip
    batch: list[GroupResult] = []
    lags: list[int] = []
    step = 0
    async for group in groups:
        batch.append(group)
        lags.append(group_lag(group, policy.version))
        if len(batch) < algo.tasks_per_step:
            continue
        step += 1
        scalars = learner.step(step, batch, algo.lr)
        scalars |= {"lag_max": float(max(lags)), "lag_mean": float(np.mean(lags))}
        scalars |= {f"lag_{lag}": float(lags.count(lag)) for lag in sorted(set(lags))}
        batch, lags = [], []
        await policy.announce(step, model=endpoint(_checkpoint_name(step)))
        await report(step, scalars)
        if step == algo.steps:
            break
    await policy.cancel_running()  # the groups still in flight would train nothing now


async def main() -> int:
    from gymflow.workers import logs

    logs.configure()  # structured log lines on stderr; stdout keeps the trainer's own progress lines
    return await train(await TrainerSession.connect())


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
