"""verifiers' own scoring of conversations gymflow recorded (run with the package's python).

Each conversation is committed turn by turn through verifiers' own graph machinery (what its
interception does as a harness runs: `prepare_turn` on the prompt so far, `commit` of the model's
response), then the task scores the trace with its `score()`, as `vf-replay` re-scores saved
traces. Reads `{"taskset", "trajectories": [{"vf_task", "messages"}]}` on stdin, prints one
`{"total", "rewards"}` per trajectory.
"""

import asyncio
import json
import sys

import verifiers.v1 as vf
from verifiers.v1 import graph


def vf_message(message: dict) -> vf.Message:
    role, content = message["role"], message.get("content") or ""
    if role == "system":
        return vf.SystemMessage(content=content)
    if role == "user":
        return vf.UserMessage(content=content)
    if role == "tool":
        return vf.ToolMessage(tool_call_id=message.get("tool_call_id") or "", content=content, name=message.get("name"))
    calls = [
        vf.ToolCall(id=c["id"], name=c["name"], arguments=json.dumps(c.get("arguments") or {}))
        for c in message.get("tool_calls") or []
    ]
    return vf.AssistantMessage(content=content, tool_calls=calls or None)


async def main() -> None:
    job = json.load(sys.stdin)
    config = vf.taskset_config_type(job["taskset"]).model_validate({"id": job["taskset"]})
    taskset = vf.load_taskset(config)
    task_cls = type(taskset).task_type()
    out = []
    for trajectory in job["trajectories"]:
        task = task_cls(task_cls.data_type().model_validate(trajectory["vf_task"]), taskset.config.task)
        trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=vf.AgentInfo(config=vf.AgentConfig()),
        )
        messages = [vf_message(m) for m in trajectory["messages"]]
        for index, message in enumerate(messages):
            if isinstance(message, vf.AssistantMessage):
                reason = "tool_calls" if message.tool_calls else "stop"
                response = vf.Response(
                    id=f"r{index}", created=0, model="reference", message=message, finish_reason=reason
                )
                graph.prepare_turn(trace, messages[:index]).commit(response)
        await task.score(trace)
        out.append({"total": trace.reward, "rewards": {k: r.value for k, r in trace.rewards.items() if r is not None}})
    print(json.dumps(out), flush=True)


asyncio.run(main())
