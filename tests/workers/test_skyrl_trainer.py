"""The SkyRL trainer's mapping of a run config to SkyRL's Hydra keys (SkyRL itself needs a GPU)."""

from __future__ import annotations

from pathlib import Path

from mcp_support import ROOT

from gymflow.workers.sdk.training import load_run_config
from gymflow.workers.trainers.skyrl import overrides


def test_the_run_config_becomes_skyrl_overrides() -> None:
    config = load_run_config(ROOT / "envs" / "examples" / "train_math_skyrl.yaml")
    config.algorithm.extra["skyrl_overrides"] = ["trainer.eval_interval=5"]
    values = dict(o.split("=", 1) for o in overrides(config, data_dir=Path("/d"), ckpt_dir=Path("/c"), gpus=4))
    assert values["environment.env_class"] == "gymflow-math"
    assert values["trainer.policy.model.path"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert values["generator.n_samples_per_prompt"] == "8" and values["trainer.train_batch_size"] == "64"
    assert values["trainer.policy.optimizer_config.lr"] == "1e-06" and values["trainer.ckpt_interval"] == "50"
    assert values["data.train_data"] == "['/d/train.parquet']" and values["trainer.ckpt_path"] == "/c"
    assert values["generator.num_inference_engines"] == "4" and values["trainer.eval_interval"] == "5"
    other = config.model_copy(update={"env": "envs/examples/calculator.yaml"})
    values = dict(o.split("=", 1) for o in overrides(other, data_dir=Path("/d"), ckpt_dir=Path("/c"), gpus=1))
    assert values["environment.env_class"] == "gymflow"
    assert values["+environment.skyrl_gym.gymflow.env"] == "envs/examples/calculator.yaml"
