"""Rewards that score a stored trajectory again, without a model call or a tool call.

A finished batch keeps every trajectory it ran (gymflow.activities.storage), so another reward can
score the same conversations later: `gymflow eval rescore BATCH --reward SPEC`. The spec is what an
env file's `reward:` takes (gymflow.envs.envfile): `file.py:function` or `module:function`, a
reward-library entry (`{fn: math_equivalent, extract: answer_tag}`, gymflow.envs.mcp.library_reward),
or a list of them (summed); or the name of an env (or an env file) whose reward is to be used.

Only a reward that reads the conversation and the ground truth can score a stored trajectory: the
rollout's servers and workspace are long gone. So loading refuses, with `LiveRewardError` (never a
silent 0), a reward function that names `workspace` or `mcp_client` (`live_parameters`), and an env
whose `compute_reward` reads per-rollout state: one that does not declare `offline_reward`, unless
its reward is `McpEnv`'s own over reward functions that qualify (an env file's `reward:`).
A reward function that raises on one trajectory makes that trajectory infra-failed
(`reward_error`), as it would in a live rollout (gymflow.activities.rescore).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from gymflow.envs.contract import BaseEnv, Message, Reward
from gymflow.envs.errors import LiveRewardError, RewardSpecError, UserError
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.mcp.library_reward import DEFAULT_REWARD, LibraryReward, LibraryRewardSpec
from gymflow.envs.mcp.reward import RewardFn, live_parameters, score, signature_problem
from gymflow.envs.plugins import load_callable
from gymflow.envs.registry import env_class, is_env_file

RewardSpec = str | LibraryRewardSpec | list[str | LibraryRewardSpec]
"""A reward to rescore with: an env file's `reward:` value, or an env's name (see the module doc)."""
SPEC = TypeAdapter(RewardSpec)
OFFLINE_KWARGS = ("completion", "ground_truth", "messages", "rollout_id", "task_id", "metadata")
"""The keywords a reward function gets when it scores a stored trajectory."""
FIELD = "--reward"


def parse_reward_spec(text: str, *, base_dir: Path) -> RewardSpec:
    """The spec a `--reward` argument names, its relative paths made absolute against `base_dir`.

    YAML/JSON text (`{fn: exact_match, extract: answer}`, `[a.py:f, {check: ...}]`) is a reward-library
    entry or a list; anything else is one `file.py:function`, `module:function` or env name. Paths
    are made absolute here because the worker that scores may run in another directory.

    Raises:
        RewardSpecError: The text is not a reward spec.
    """
    text = text.strip()
    if not text:
        raise RewardSpecError(f"{FIELD}: empty; give file.py:function, module:function, {{fn: ...}} or an env name")
    value: Any = text
    if text[0] in "{[":
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RewardSpecError(f"{FIELD}: not valid YAML: {exc}".replace("\n", " ")) from exc
    try:
        spec = SPEC.validate_python(value)
    except ValidationError as exc:
        raise RewardSpecError(f"{FIELD}: {problems(exc)}") from exc
    return absolute(spec, base_dir)


def problems(exc: ValidationError) -> str:
    """A validation error in one line."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())


def absolute(spec: RewardSpec, base_dir: Path) -> RewardSpec:
    """`spec` with its relative `file.py` and env-file paths resolved against `base_dir`."""
    if isinstance(spec, list):
        return [item for one in spec for item in _as_list(absolute(one, base_dir))]
    if isinstance(spec, LibraryRewardSpec):
        return spec.model_copy(
            update={
                "fn": spec.fn and _absolute_target(spec.fn, base_dir),
                "check": spec.check and _absolute_target(spec.check, base_dir),
            }
        )
    if ":" in spec:
        return _absolute_target(spec, base_dir)
    if is_env_file(spec) and not Path(spec).is_absolute():
        return str((base_dir / spec).resolve())
    return spec


def _as_list(spec: RewardSpec) -> list[str | LibraryRewardSpec]:
    return spec if isinstance(spec, list) else [spec]


def _absolute_target(target: str, base_dir: Path) -> str:
    path, sep, attr = target.rpartition(":")
    if sep and path.endswith(".py") and not Path(path).is_absolute():
        return f"{(base_dir / path).resolve()}:{attr}"
    return target


def describe(spec: RewardSpec) -> str:
    """The spec as one line of text (memos, reports, the CLI's output)."""
    if isinstance(spec, str):
        return spec
    return json.dumps(SPEC.dump_python(spec, mode="json", exclude_defaults=True), separators=(", ", ": "))


class OfflineReward:
    """A reward loaded to score stored trajectories (`load`), and how it scores one (`score`).

    Attributes:
        env: The env whose `compute_reward` scores (an env that declares `offline_reward`), whose
            instance `score` is then given; None when reward functions score.
        description: The spec as text.
    """

    def __init__(self, *, fns: tuple[RewardFn, ...] = (), env: str | None = None, description: str) -> None:
        self.fns = fns
        self.env = env
        self.description = description

    @classmethod
    def load(cls, spec: RewardSpec) -> OfflineReward:
        """The reward `spec` names, checked to score from a stored trajectory alone.

        Raises:
            RewardSpecError: It cannot be loaded (a missing file or function, an unknown env, a
                signature that cannot take the call).
            LiveRewardError: It reads the rollout's live tools or workspace.
        """
        description = describe(spec)
        if isinstance(spec, str) and ":" not in spec:
            return cls._of_env(spec, description)
        items = _as_list(spec)
        fns = tuple(
            _function(item, f"{FIELD}[{index}]" if isinstance(spec, list) else FIELD)
            for index, item in enumerate(items)
        )
        return cls(fns=fns, description=description)

    @classmethod
    def _of_env(cls, name: str, description: str) -> OfflineReward:
        try:
            env = env_class(name)
        except UserError as exc:
            raise RewardSpecError(f"{FIELD} {name}: {exc}") from exc
        if issubclass(env, McpEnv) and env.compute_reward is McpEnv.compute_reward:
            fns = tuple(env.reward_fns) or (DEFAULT_REWARD,)
            for fn in fns:
                live = live_parameters(fn)
                if live:
                    raise LiveRewardError(
                        f"{FIELD} {name}: its reward function {getattr(fn, '__name__', fn)} reads the live rollout "
                        f"(it takes {', '.join(live)}), which a finished batch no longer has; "
                        "only a reward of the conversation and the ground truth can rescore"
                    )
            return cls(fns=fns, description=description)
        if not env.offline_reward:
            raise LiveRewardError(
                f"{FIELD} {name}: {env.__name__}.compute_reward may read the rollout's live tools or workspace "
                "(the env does not declare offline_reward = True), which a finished batch no longer has; "
                "rescore with a reward function of the conversation and the ground truth instead"
            )
        return cls(env=name, description=description)

    async def score(
        self,
        messages: list[Message],
        ground_truth: Any,
        *,
        rollout_id: str,
        task_id: str,
        metadata: Mapping[str, Any],
        instance: BaseEnv | None = None,
    ) -> Reward:
        """Score one stored conversation (`instance`: the instance of `env`, when an env scores).

        Raises:
            Whatever the reward raises: the caller makes the trajectory infra-failed with it.
        """
        if self.env is None:
            return await score(
                self.fns,
                messages=messages,
                ground_truth=ground_truth,
                tools=None,
                rollout_id=rollout_id,
                task_id=task_id,
                metadata=metadata,
            )
        if instance is None:
            raise ValueError(f"scoring with env {self.env} needs its instance")
        raw = await instance.compute_reward(rollout_id, messages, ground_truth, task_id=task_id, metadata=metadata)
        return Reward.of(raw)


def _function(item: str | LibraryRewardSpec, where: str) -> RewardFn:
    """One reward function of a spec, checked to score from a stored trajectory."""
    if isinstance(item, LibraryRewardSpec):
        try:
            return LibraryReward(item, field=where)
        except ValueError as exc:
            raise RewardSpecError(str(exc)) from exc
    if ":" not in item:
        raise RewardSpecError(f"{where}: {item!r} is not file.py:function or module:function (an env name goes alone)")
    try:
        fn = load_callable(item, field=where)
    except ValueError as exc:
        raise RewardSpecError(str(exc)) from exc
    live = live_parameters(fn)
    if live:
        raise LiveRewardError(
            f"{where}: {item} reads the live rollout (it takes {', '.join(live)}), which a finished batch no "
            "longer has; a reward that rescores takes the conversation and the ground truth: "
            "fn(completion, ground_truth, **kwargs)"
        )
    problem = signature_problem(fn, **dict.fromkeys(OFFLINE_KWARGS))
    if problem is not None:
        raise RewardSpecError(
            f"{where}: {item} is {problem}; a reward that rescores is called as fn(completion, ground_truth, **kwargs) "
            f"(keywords {', '.join(OFFLINE_KWARGS)})"
        )
    return fn
