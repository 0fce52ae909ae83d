"""A real GPU trainer behind the trainer contract: SkyRL (skyrl-train 0.3.1, vLLM, FSDP2) on a
SkyPilot cluster, playing gymflow's envs through the skyrl-gym adapter (gymflow.workers.trainers.integrations.skyrl).

`deploy/trainer_skyrl.yaml` runs, on the cluster:

    python -m gymflow.workers.trainers.skyrl prepare          # the run's splits -> SkyRL parquet rows
    python -m gymflow.workers.trainers.skyrl train            # SkyRL's PPO/GRPO loop, reporting to the run

`train` runs SkyRL's `BasePPOExp` with Hydra overrides made from the run config (`overrides`):
model, GRPO group size, learning rate, batch, checkpoint interval, the env (`gymflow-<env>`, whose
episodes are gymflow sessions on the run's task queue); `algorithm.extra.skyrl_overrides` adds any
other SkyRL key. Its tracker also reports every logged step (scalars) to the run; after training
each `global_step_N` checkpoint SkyRL wrote is reported (its path on the cluster, no endpoint: the
run records it in its lineage but cannot evaluate it without a server for it), then `finish`.

This cannot run here (no GPU); `overrides` is unit-tested, and the task YAML is parsed by the real
SkyPilot in the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from gymflow.activities.training_schema import CheckpointReport, RunConfig

DATA_DIR = Path(os.environ.get("GYMFLOW_SKYRL_DATA", str(Path.home() / "gymflow-data")))
CKPT_DIR = Path(os.environ.get("GYMFLOW_SKYRL_CKPT", str(Path.home() / "gymflow-ckpt")))


def overrides(config: RunConfig, *, data_dir: Path, ckpt_dir: Path, gpus: int) -> list[str]:
    """SkyRL Hydra overrides for the run config (gymflow's names -> SkyRL's keys)."""
    algo = config.algorithm
    env_class = f"gymflow-{config.env}" if config.env in {"math", "sheets"} else "gymflow"
    values: dict[str, Any] = {
        "data.train_data": f"['{data_dir / 'train.parquet'}']",
        "data.val_data": f"['{data_dir / 'validation.parquet'}']",
        "trainer.policy.model.path": config.model.model or "Qwen/Qwen2.5-1.5B-Instruct",
        "trainer.algorithm.advantage_estimator": "grpo",
        "trainer.strategy": "fsdp2",
        "trainer.placement.colocate_all": "true",
        "trainer.placement.policy_num_gpus_per_node": gpus,
        "trainer.placement.ref_num_gpus_per_node": gpus,
        "generator.num_inference_engines": gpus,
        "generator.inference_engine_tensor_parallel_size": 1,
        "generator.backend": "vllm",
        "generator.batched": "false",  # multi-turn tool use: one episode per trajectory
        "generator.max_turns": config.limits.max_turns,
        "generator.n_samples_per_prompt": algo.group_size,
        "trainer.train_batch_size": algo.tasks_per_step,
        "trainer.policy_mini_batch_size": algo.tasks_per_step,
        "trainer.policy.optimizer_config.lr": algo.lr,
        "trainer.ckpt_interval": algo.checkpoint_every,
        "trainer.ckpt_path": str(ckpt_dir),
        "trainer.epochs": algo.extra.get("epochs", 1),
        "trainer.logger": "console",
        "trainer.run_name": config.run_id or "gymflow",
        "environment.env_class": env_class,
    }
    if env_class == "gymflow":
        values[f"+environment.skyrl_gym.{env_class}.env"] = config.env
    return [f"{k}={v}" for k, v in values.items()] + [str(o) for o in algo.extra.get("skyrl_overrides", [])]


class _Reporter:
    """Reports to the run from synchronous code (SkyRL's tracker) through a background event loop."""

    def __init__(self) -> None:
        from gymflow.workers.sdk.trainer import TrainerSession

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.session = self.call(TrainerSession.connect())

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


def prepare() -> int:
    """Write the run's splits as SkyRL parquet rows (the adapter's `dataset_row`)."""
    import pandas as pd

    from gymflow.workers.trainers.integrations.skyrl import dataset_row

    reporter = _Reporter()
    session = reporter.session
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    for split, tasks in (
        ("train", reporter.call(session.train_tasks())),
        ("validation", reporter.call(session.eval_tasks())),
    ):
        pd.DataFrame([dataset_row(session.spec.env, task) for task in tasks]).to_parquet(DATA_DIR / f"{split}.parquet")
        print(f"{split}: {len(tasks)} rows", flush=True)
    return 0


def train(gpus: int) -> int:
    """SkyRL's training loop (in a Ray task, as SkyRL's own entry point runs it), reporting to the run."""
    import hydra
    import ray
    from skyrl_train.entrypoints.main_base import BasePPOExp, config_dir
    from skyrl_train.utils import validate_cfg
    from skyrl_train.utils.tracking import Tracking
    from skyrl_train.utils.utils import initialize_ray

    reporter = _Reporter()
    config = reporter.session.spec.config
    with hydra.initialize_config_dir(config_dir=config_dir, version_base=None):
        hydra_overrides = overrides(config, data_dir=DATA_DIR, ckpt_dir=CKPT_DIR, gpus=gpus)
        cfg = hydra.compose(config_name="ppo_base_config", overrides=hydra_overrides)
    validate_cfg(cfg)
    initialize_ray(cfg)

    @ray.remote(num_cpus=1)
    def entrypoint(cfg: Any) -> None:
        import gymflow.workers.trainers.integrations.skyrl  # noqa: F401 - registers gymflow-* envs

        step_reporter = _Reporter()

        class Reporting(Tracking):
            def log(self, data: dict[str, Any], step: int, commit: bool = False) -> None:
                super().log(data, step, commit=commit)
                scalars = {k: float(v) for k, v in data.items() if isinstance(v, int | float)}
                step_reporter.call(step_reporter.session.report(int(step), scalars))

        class Experiment(BasePPOExp):
            def get_tracker(self) -> Any:
                c = self.cfg.trainer
                return Reporting(
                    project_name=c.project_name, experiment_name=c.run_name, backends=c.logger, config=self.cfg
                )

        Experiment(cfg).run()

    ray.get(entrypoint.remote(cfg))
    host = socket.gethostname()
    for folder in sorted(CKPT_DIR.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1])):
        step = int(folder.name.rsplit("_", 1)[1])
        checkpoint = CheckpointReport(name=folder.name, step=step, uri=f"file://{host}{folder}")
        reporter.call(reporter.session.report(step, {}, checkpoint=checkpoint))
    reporter.call(reporter.session.finish())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gymflow.workers.trainers.skyrl", description=__doc__)
    parser.add_argument("command", choices=["prepare", "train"])
    parser.add_argument("--gpus", type=int, default=int(os.environ.get("GYMFLOW_SKYRL_GPUS", "1")))
    args = parser.parse_args(argv)
    return prepare() if args.command == "prepare" else train(args.gpus)


if __name__ == "__main__":
    sys.exit(main())
