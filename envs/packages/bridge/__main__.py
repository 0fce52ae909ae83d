"""`python -m gymflow_bridge describe|dataset|serve`, with the env named in GYMFLOW_BRIDGE_ENV.

* `describe`: the env's kind, description, system prompt, tools and flags, as one JSON object;
* `dataset --name NAME --options JSON --out FILE`: the dataset's tasks as JSONL in FILE (written
  whole or not at all), and `{"tasks": n}`;
* `serve`: the rollout's MCP server on stdin/stdout, until stdin closes.

One-shot commands print one JSON object on the real stdout (`{"error": ...}` and exit status 1 on
failure, the traceback on stderr). Every way out kills the processes the env started (`procs`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from . import base, procs
from .rpc import Channel, Server, take_stdout, text_result

ENV_VAR = "GYMFLOW_BRIDGE_ENV"
"""JSON `{"target": "module:attr", "kind": "" (detect), "options": {...}}`: the env to run."""
CONTROL = "gymflow."
"""Prefix of the tools gymflow calls and never offers the model."""
CONTROL_TOOLS = ("init", "reward", "respond", "copy_in", "copy_out", "release")


def detect(target: Any) -> str:
    from .openenv import is_openenv
    from .plain import has_shape, is_benchmax
    from .verifiers import is_verifiers

    if is_verifiers(target):
        return "verifiers"
    if is_openenv(target):
        return "openenv"
    if is_benchmax(target):
        return "benchmax"
    if has_shape(target):
        return "plain"
    raise TypeError(
        f"{target!r} is not an env gymflow can import: a benchmax BaseEnv subclass (or a class of its shape: "
        "list_tools, run_tool, compute_reward), a verifiers taskset, or an OpenEnv app or Environment"
    )


def adapter_for(decl: dict[str, Any]) -> base.Adapter:
    target = base.load_target(str(decl["target"]))
    kind = decl.get("kind") or detect(target)
    options = dict(decl.get("options") or {})
    if kind == "verifiers":
        from .verifiers import VerifiersAdapter

        return VerifiersAdapter(target, options)
    if kind == "openenv":
        from .openenv import OpenEnvAdapter

        return OpenEnvAdapter(target, options)
    if kind in {"benchmax", "plain"}:
        from .plain import PlainAdapter

        return PlainAdapter(target, options)
    raise ValueError(f"unknown env kind {kind!r}")


def _versions(adapter: base.Adapter) -> dict[str, str]:
    from importlib import metadata

    found = {"python": sys.version.split()[0]}
    for framework in ("benchmax", "verifiers", "openenv-core"):
        try:
            found[framework] = metadata.version(framework)
        except metadata.PackageNotFoundError:
            continue
    del adapter
    return found


async def describe(adapter: base.Adapter) -> dict[str, Any]:
    await adapter.start()
    return {"kind": adapter.kind, **adapter.describe(), "tools": await adapter.tools(), "versions": _versions(adapter)}


async def dataset(adapter: base.Adapter, name: str, options: dict[str, Any], out: Path) -> dict[str, Any]:
    await adapter.start()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    count = 0
    with tmp.open("w", encoding="utf-8") as file:
        for task in adapter.dataset(name, options):
            file.write(json.dumps(task, ensure_ascii=False, default=str) + "\n")
            count += 1
    tmp.replace(out)
    return {"tasks": count}


class Rollout:
    """The serve side: one env adapter, at most one rollout at a time."""

    def __init__(self, adapter: base.Adapter) -> None:
        self.adapter = adapter
        self.rollout_id: str | None = None

    async def tools(self) -> list[dict[str, Any]]:
        control = [
            {
                "name": CONTROL + name,
                "description": "gymflow control (never offered to the model)",
                "inputSchema": {"type": "object"},
            }
            for name in CONTROL_TOOLS
        ]
        return [*await self.adapter.tools(), *control]

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if not name.startswith(CONTROL):
            if self.rollout_id is None:
                return text_result("error: no rollout is initialised on this server", is_error=True)
            return await self.adapter.call(self.rollout_id, name, arguments)
        try:
            answer = await self._control(name[len(CONTROL) :], arguments)
        except base.BadArguments as exc:
            return _failure("args", exc)
        except base.EnvFault as exc:
            return _failure("fault", exc)
        except Exception as exc:  # the env's own code raised: gymflow decides what that means for the step
            traceback.print_exc()
            return _failure("env", exc)
        return text_result(json.dumps(answer, default=str), structured=answer)

    async def _control(self, verb: str, args: dict[str, Any]) -> dict[str, Any]:
        adapter = self.adapter
        if verb == "init":
            self.rollout_id = str(args["rollout_id"])
            return dict(await adapter.init(self.rollout_id, dict(args.get("args") or {})))
        rollout_id = self.rollout_id or str(args.get("rollout_id", ""))
        if verb == "reward":
            return await adapter.reward(
                rollout_id, list(args["messages"]), args.get("ground_truth"), dict(args.get("extra") or {})
            )
        if verb == "respond":
            return {"messages": await adapter.respond(rollout_id, list(args["messages"]))}
        if verb == "copy_in":
            return {"supported": await adapter.copy_in(rollout_id, str(args["source"]), args.get("name"))}
        if verb == "copy_out":
            return {"supported": await adapter.copy_out(rollout_id, str(args["name"]), str(args["destination"]))}
        if verb == "release":
            try:
                await adapter.release(rollout_id)
            finally:
                self.rollout_id = None
                killed = procs.kill_descendants()
            return {"killed": killed}
        raise base.BadArguments(f"unknown control tool {CONTROL}{verb}")


def _failure(kind: str, exc: BaseException) -> dict[str, Any]:
    error = {"error": f"{type(exc).__name__}: {exc}", "kind": kind}
    return text_result(json.dumps(error), is_error=True, structured=error)


async def serve(adapter: base.Adapter, channel: Channel) -> None:
    await adapter.start()
    rollout = Rollout(adapter)
    await Server(channel, name="gymflow-bridge", version="1", tools=rollout.tools, call=rollout.call).serve()


def _exit(status: int) -> None:
    """Kill what the env started and leave now: neither env threads nor calls still running in
    the loop's executor may hold the process open (asyncio.run would wait for them)."""
    procs.kill_descendants()
    sys.stderr.flush()
    os._exit(status)


async def run(command: str, args: argparse.Namespace, channel: Channel) -> None:
    """Run `command` and leave the process from inside the loop (see `_exit`)."""
    try:
        adapter = adapter_for(json.loads(os.environ[ENV_VAR]))
        if command == "serve":
            await serve(adapter, channel)
            _exit(0)
        if command == "describe":
            answer = await describe(adapter)
        else:
            answer = await dataset(adapter, args.name, json.loads(args.options), args.out)
    except Exception as exc:
        traceback.print_exc()
        channel.send({"error": f"{type(exc).__name__}: {exc}"})
        _exit(1)
    channel.send(answer)
    _exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gymflow_bridge")
    parser.add_argument("command", choices=["describe", "dataset", "serve"])
    parser.add_argument("--name", default="")
    parser.add_argument("--options", default="{}")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "dataset" and args.out is None:
        parser.error("dataset needs --out FILE")
    channel = take_stdout()
    procs.become_subreaper()
    signal.signal(signal.SIGTERM, lambda *_: _exit(143))
    asyncio.run(run(args.command, args, channel))


if __name__ == "__main__":
    main()
