"""The rows TRL's GRPOTrainer trains on, made from gymflow trajectories (gymflow.workers.trainers.integrations.trl).

`record_of` turns a trajectory into one row: the first turn's prompt ids, every later token (the
model's and the env's, as sampled), the env mask (1 model, 0 env), the sampler's logprobs and the
reward; an infra-failed rollout becomes a masked-out row with no reward, never a 0. `logprob_drift`
compares the trainer's logprobs of those tokens with the sampler's. Torch is imported only there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gymflow.envs.contract import Trajectory
from gymflow.envs.errors import TokenDataError, TokenMismatch
from gymflow.envs.wire.tokens import build_segments


@dataclass
class Record:
    """One row's training data, as TRL's `rollout_func` returns it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float]
    reward: float | None
    rollout_id: str
    cut: bool = False
    """The rollout's token data did not extend turn to turn: only its first consistent segment is here."""


@dataclass
class StepStats:
    """What one call of the rollout function did."""

    rows: int = 0
    groups: int = 0
    infra_failed: int = 0
    """Rows masked out: their rollout was infra-failed after every retry."""
    replayed: int = 0
    """Rollouts played again after an infra failure."""
    token_cut: int = 0
    logprob_diff_mean: float | None = None
    logprob_diff_max: float | None = None
    rollout_ids: list[str] = field(default_factory=list)

    def scalars(self) -> dict[str, float]:
        out = {"gymflow/infra_failed": float(self.infra_failed), "gymflow/replayed": float(self.replayed),
               "gymflow/token_cut": float(self.token_cut)}  # fmt: skip
        if self.logprob_diff_mean is not None and self.logprob_diff_max is not None:
            out["gymflow/logprob_diff_mean"] = self.logprob_diff_mean
            out["gymflow/logprob_diff_max"] = self.logprob_diff_max
        return out


def record_of(trajectory: Trajectory) -> Record:
    """A trajectory as TRL's record (see the module docstring); an infra-failed one masked out.

    Raises:
        TokenDataError: A completed rollout without token data (the endpoint gave none, or token mode was off).
    """
    if trajectory.infra_failed or trajectory.reward is None:
        prompt = list(trajectory.tokens[0].prompt_ids) if trajectory.tokens else []
        return Record(prompt, [], [], [], None, trajectory.rollout_id)
    turns = [t for t in trajectory.tokens]
    if not turns:
        raise TokenDataError(
            f"rollout {trajectory.rollout_id} has no token data: roll out with ModelConfig(tokens='vllm') "
            "against an endpoint that returns token ids and logprobs"
        )
    cut = False
    try:
        sequence = trajectory.token_sequence()
    except TokenMismatch:
        sequence, cut = build_segments(turns)[0], True
    first = len(turns[0].prompt_ids)
    ids, mask = list(sequence.ids), list(sequence.loss_mask)
    logprobs = list(sequence.logprobs) if sequence.logprobs is not None else [0.0] * len(ids)
    return Record(ids[:first], ids[first:], mask[first:], logprobs[first:], trajectory.reward.total,
                  trajectory.rollout_id, cut)  # fmt: skip


def groups_of(prompts: Sequence[Any], size: int) -> list[tuple[int, int]]:
    """(start, end) of each run of `size` equal prompts, in order.

    Raises:
        ValueError: The rows are not runs of `size` equal prompts (TRL repeats each prompt
            `num_generations` times in a row).
    """
    if size < 1 or len(prompts) % size:
        raise ValueError(f"{len(prompts)} prompt rows are not groups of num_generations={size}")
    spans = [(start, start + size) for start in range(0, len(prompts), size)]
    for start, end in spans:
        if any(prompts[i] != prompts[start] for i in range(start, end)):
            raise ValueError(f"prompt rows {start}..{end - 1} are not one prompt repeated num_generations times")
    return spans


def fill_masked_prompts(records: list[Record], size: int) -> None:
    """A masked-out row still needs a prompt TRL can pad: its group's (one prompt, one group); its
    completion is empty, so it carries no token of loss."""
    for start in range(0, len(records), size):
        group = records[start : start + size]
        prompt = next((r.prompt_ids for r in group if r.prompt_ids), None)
        for r in group:
            if not r.prompt_ids and prompt is not None:
                r.prompt_ids = list(prompt)


def unwrap(trainer: Any) -> Any:
    """The trainer's model itself (not accelerate's wrapper), which the optimizer updates in place."""
    accelerator = getattr(trainer, "accelerator", None)
    return accelerator.unwrap_model(trainer.model) if accelerator is not None else trainer.model


def logprob_drift(
    trainer: Any, records: Sequence[Record], temperature: float | None
) -> tuple[float | None, float | None]:
    """Mean and max |trainer logprob - sampler logprob| over every model token of `records`."""
    import torch

    model = unwrap(trainer)
    device = next(model.parameters()).device
    scale = temperature if temperature else 1.0
    diffs: list[torch.Tensor] = []
    with torch.no_grad():
        for r in records:
            if not r.completion_ids or not any(r.env_mask):
                continue
            ids = torch.tensor([r.prompt_ids + r.completion_ids], device=device)
            logits = model(input_ids=ids).logits[0, len(r.prompt_ids) - 1 : -1].float() / scale
            mine = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(r.prompt_ids) :, None])[:, 0]
            mask = torch.tensor(r.env_mask, device=device, dtype=torch.bool)
            sampled = torch.tensor(r.logprobs, device=device, dtype=mine.dtype)
            diffs.append((mine - sampled)[mask].abs())
    if not diffs:
        return None, None
    every = torch.cat(diffs)
    return float(every.mean()), float(every.max())
