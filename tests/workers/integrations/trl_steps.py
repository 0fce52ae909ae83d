"""GRPO steps of TRL's GRPOTrainer on gymflow rollouts, in the trainer venv (.venv-trl); JSON out.

    .venv-trl/bin/python tests/workers/integrations/trl_steps.py --address HOST:PORT --task-queue Q --out F

The model is `load_model(--model)` (the tiny random one by default), served in this process to the
rollouts, which an in-process gymflow worker plays on the env file next to this script (the
calculator's tools; a reward the random model's text varies on). Written to --out: TRL's log of every
step, gymflow's per-step stats (the sampler-vs-trainer logprob drift among them), how far the
parameters moved, and the rows the last step trained on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV_FILE = HERE / "trl_env" / "env.yaml"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--env", default=str(ENV_FILE))
    parser.add_argument("--dataset", default="default", help="the env's dataset name (math: generated)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--workspaces", default=None)
    args = parser.parse_args()
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from gymflow.envs.registry import env_class
    from gymflow.workers.config import Settings
    from gymflow.workers.trainers.integrations.examples.trl_grpo import grpo
    from gymflow.workers.trainers.integrations.trl_records import unwrap

    started = time.monotonic()
    tasks = list(env_class(args.env).load_dataset(args.dataset))[: args.prompts * args.steps]
    settings = Settings(
        temporal_address=args.address, task_queue=args.task_queue, mcp_pool_size=0,
        **({"workspace_root": Path(args.workspaces)} if args.workspaces else {}),
    )  # fmt: skip
    trainer, rollouts = grpo(
        args.env, tasks, settings, model_spec=args.model, steps=args.steps, prompts=args.prompts,
        generations=args.generations, max_tokens=args.max_tokens, lr=args.lr,
        output_dir=str(Path(args.out).with_suffix(".trl")),
    )  # fmt: skip
    loaded_s = time.monotonic() - started
    before = {name: p.detach().clone() for name, p in unwrap(trainer).named_parameters()}
    last: dict[str, object] = {}
    original = rollouts.__call__

    def keep_last(prompts: list[object], trainer: object) -> dict[str, object]:
        output = original(prompts, trainer)
        last.update(output)
        return output

    trainer.rollout_func = keep_last
    try:
        trainer.train()
    finally:
        rollouts.close()
    moved = sum(float((p.detach() - before[name]).abs().sum()) for name, p in unwrap(trainer).named_parameters())
    keys = ("prompt_ids", "completion_ids", "env_mask", "logprobs", "env_reward")
    rows = [dict(zip(keys, values, strict=True)) for values in zip(*(last[k] for k in keys), strict=True)]
    result = {
        "loaded_s": loaded_s,
        "total_s": time.monotonic() - started,
        "log": trainer.state.log_history,
        "stats": [s.scalars() for s in rollouts.history],
        "rollout_ids": [s.rollout_ids for s in rollouts.history],
        "moved": moved,
        "rows": rows,
        "parameters": sum(p.numel() for p in unwrap(trainer).parameters()),
    }
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
