"""benchmax's own way of running an env, on the actions gymflow recorded (run with the package's python).

For each trajectory: a fresh `init_rollout`, every recorded tool call through `run_tool`, then the
reward of the final answer the way benchmax scores it: the env's `compute_reward`, or, for envs
that only list `reward_funcs` (its MathEnv), each function called positionally as benchmax's own
verifiers adapter calls it, `reward_func(prompt, completion, answer, workspace)`. Reads
`{"target", "trajectories": [{"messages", "ground_truth", "init_args"}]}` on stdin, prints the
rewards (one dict per trajectory) as JSON.
"""

import asyncio
import importlib
import inspect
import json
import os
import sys
import uuid


async def settle(value):
    return await value if inspect.isawaitable(value) else value


async def main() -> None:
    job = json.load(sys.stdin)
    module, _, name = job["target"].partition(":")
    cls = getattr(importlib.import_module(module), name)
    abstract = "compute_reward" in getattr(cls, "__abstractmethods__", ())
    env = (type(cls.__name__, (cls,), {"compute_reward": None}) if abstract else cls)()
    rewards = []
    for trajectory in job["trajectories"]:
        rollout = uuid.uuid4().hex
        await settle(env.init_rollout(rollout, **trajectory["init_args"]))
        messages = trajectory["messages"]
        for message in messages:
            for call in message.get("tool_calls") or []:
                await settle(env.run_tool(rollout, call["name"], **call["arguments"]))
        completion = next(m["content"] for m in reversed(messages) if m["role"] == "assistant")
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        if abstract:
            workspace = env.get_rollout_workspace(rollout)
            scores = {
                fn.__name__: fn(prompt, completion, trajectory["ground_truth"], workspace) for fn in cls.reward_funcs
            }
        else:
            scores = await settle(env.compute_reward(rollout, completion, trajectory["ground_truth"]))
        rewards.append({k: float(v) for k, v in scores.items()})
    print(json.dumps(rewards), flush=True)
    os._exit(0)  # benchmax's LocalMCPEnv holds a thread and servers; the caller kills the process group


asyncio.run(main())
