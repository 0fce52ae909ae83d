"""benchmax envs, and plain classes of benchmax's shape, run unmodified.

benchmax's `BaseEnv` is the shape: `list_tools`, `run_tool(rollout_id, name, **args)`,
`init_rollout`, `compute_reward(rollout_id, completion, ground_truth, **kwargs)`, the workspace
copies and `dataset_preprocess` / `load_dataset`. Its envs mix sync and async methods (`BaseEnv`
declares them async, `LocalMCPEnv` overrides them sync): every call goes through `base.call`, which
takes either.

Where benchmax leaves a method to its adapters, this one does what they do:

* `compute_reward` missing (benchmax's own `MathEnv` declares `reward_funcs` but not the method, so the
  class is abstract): the env is built as a subclass whose `compute_reward` calls each reward function
  by keyword, `prompt`, `completion` (the final assistant text), `ground_truth`, `workspace`, and
  returns `{function name: score}`, as benchmax's verifiers adapter scores them (weight 1 each);
* `release`: `cleanup_rollout(rollout_id)` when the env has it (`LocalMCPEnv`), `release_rollout`
  otherwise; whatever server processes it leaves are killed by the bridge (`procs`);
* tool results are rendered as benchmax's adapter renders them (`str(result)`), and a tool that
  raises is an error observation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import base
from .rpc import text_result


def is_benchmax(obj: Any) -> bool:
    """Whether `obj` subclasses benchmax's BaseEnv (benchmax imported only if the env did)."""
    import sys

    module = sys.modules.get("benchmax.envs.base_env")
    return module is not None and isinstance(obj, type) and issubclass(obj, module.BaseEnv)


def has_shape(obj: Any) -> bool:
    """Whether `obj` is a class of benchmax's shape (the `plain` kind)."""
    return (
        isinstance(obj, type)
        and callable(getattr(obj, "list_tools", None))
        and callable(getattr(obj, "run_tool", None))
        and (callable(getattr(obj, "compute_reward", None)) or bool(getattr(obj, "reward_funcs", None)))
    )


async def reward_funcs_reward(
    self: Any, rollout_id: str, completion: str, ground_truth: Any, **kwargs: Any
) -> dict[str, float]:
    """benchmax's convention for envs that only list `reward_funcs`: each function by keyword."""
    workspace = _workspace(self, rollout_id)
    scores = {}
    for fn in self.reward_funcs:
        value = await base.call(fn, completion=completion, ground_truth=ground_truth, workspace=workspace, **kwargs)
        scores[getattr(fn, "__name__", type(fn).__name__)] = float(value)
    return scores


def _workspace(env: Any, rollout_id: str) -> Path:
    getter = getattr(env, "get_rollout_workspace", None)
    if callable(getter):
        found = getter(rollout_id)
        if found:
            return Path(found)
    return Path.cwd()


class PlainAdapter(base.Adapter):
    """A benchmax env (kind `benchmax`) or a class of its shape (kind `plain`)."""

    def __init__(self, target: Any, options: dict[str, Any]) -> None:
        super().__init__(target, options)
        self.kind = "benchmax" if is_benchmax(target) else "plain"
        self.env: Any = None

    def env_class(self) -> type:
        cls: type = self.target
        missing = set(getattr(cls, "__abstractmethods__", ()))
        if missing == {"compute_reward"} and getattr(cls, "reward_funcs", None):
            return type(cls.__name__, (cls,), {"compute_reward": reward_funcs_reward, "__doc__": cls.__doc__})
        if missing:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} leaves {sorted(missing)} unimplemented")
        return cls

    async def start(self) -> None:
        cls = self.env_class()
        self.env = await base.call(cls, **self.options)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["system_prompt"] = str(getattr(self.target, "system_prompt", "") or "")
        return info

    async def tools(self) -> list[dict[str, Any]]:
        listed = await base.call(self.env.list_tools)
        tools = []
        for tool in listed or []:
            get = tool.get if isinstance(tool, dict) else lambda key, t=tool: getattr(t, key, None)
            schema = get("input_schema") or get("inputSchema") or {"type": "object", "properties": {}}
            tools.append(
                {"name": str(get("name")), "description": str(get("description") or ""), "inputSchema": schema}
            )
        return tools

    async def init(self, rollout_id: str, args: dict[str, Any]) -> dict[str, Any]:
        init = getattr(self.env, "init_rollout", None)
        if callable(init):
            try:
                await base.call(init, rollout_id, **args)
            except TypeError as exc:
                raise base.BadArguments(f"init_rollout: {exc}") from exc
        elif args:
            raise base.BadArguments(f"{type(self.env).__name__} takes no init arguments, got {sorted(args)}")
        return {}

    async def call(self, rollout_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            result = await base.call(self.env.run_tool, rollout_id, name, **arguments)
        except Exception as exc:  # a tool that raises is the model's observation, as in benchmax
            return text_result(f"error: {type(exc).__name__}: {exc}", is_error=True)
        return text_result(result if isinstance(result, str) else str(result))

    async def reward(
        self, rollout_id: str, messages: list[dict[str, Any]], ground_truth: Any, extra: dict[str, Any]
    ) -> dict[str, Any]:
        completion = base.last_reply(messages)
        kwargs = {"prompt": base.first_prompt(messages), **extra}
        raw = await base.call(self.env.compute_reward, rollout_id, completion, ground_truth, **kwargs)
        if isinstance(raw, dict):
            return {"components": {str(k): float(v) for k, v in raw.items()}, "info": {"completion": completion[-200:]}}
        return {"components": {"reward": float(raw)}, "info": {}}

    async def copy_in(self, rollout_id: str, source: str, name: str | None) -> bool:
        copy = getattr(self.env, "copy_to_workspace", None)
        if not callable(copy):
            return False
        await base.call(copy, rollout_id, Path(source), name)
        return True

    async def copy_out(self, rollout_id: str, name: str, destination: str) -> bool:
        copy = getattr(self.env, "copy_from_workspace", None)
        if not callable(copy):
            return False
        await base.call(copy, rollout_id, name, Path(destination))
        return True

    async def release(self, rollout_id: str) -> None:
        for method in ("cleanup_rollout", "release_rollout"):
            fn = getattr(self.env, method, None)
            if callable(fn):
                await base.call(fn, rollout_id)
                return

    async def close(self) -> None:
        shutdown = getattr(self.env, "shutdown", None)
        if callable(shutdown):
            await base.call(shutdown)

    def dataset(self, name: str, options: dict[str, Any]) -> Iterator[dict[str, Any]]:
        loaded = self.target.load_dataset(name, **options)
        if isinstance(loaded, tuple):  # benchmax: (dataset, local path)
            loaded = loaded[0]
        split = options.get("split")
        if split is None and hasattr(loaded, "keys") and not isinstance(loaded, dict | list):
            splits = list(loaded.keys())  # a DatasetDict without a split named: train, else the first
            loaded = loaded["train" if "train" in splits else splits[0]]
        # benchmax's dataset_preprocess is an instance method: the one-shot `dataset` command starts the env.
        preprocess = getattr(self.env if self.env is not None else self.target, "dataset_preprocess", None)
        for index, example in enumerate(loaded):
            row = dict(example)
            standard = preprocess(dict(row)) if callable(preprocess) else row
            yield _task(standard, row, name, index)


def _task(standard: Any, raw: dict[str, Any], dataset: str, index: int) -> dict[str, Any]:
    """A gymflow Task dict from benchmax's StandardizedExample (prompt, ground_truth,
    init_rollout_args and any extra keys) or a Task-shaped dict."""
    data = dict(standard) if isinstance(standard, dict) else base.jsonable(standard)
    prompt = data.pop("prompt", "")
    ground_truth = data.pop("ground_truth", None)
    init_args = data.pop("init_rollout_args", None) or data.pop("init_args", None) or {}
    task_id = data.pop("id", None) or raw.get("id") or f"{dataset.rsplit('/', 1)[-1]}-{index}"
    metadata = data.pop("metadata", None) or {}
    metadata.update({k: base.jsonable(v) for k, v in data.items()})
    return {
        "id": str(task_id),
        "prompt": base.jsonable(prompt),
        "ground_truth": base.jsonable(ground_truth),
        "init_args": base.jsonable(init_args),
        "metadata": metadata,
    }
