"""OpenEnv envs, served by OpenEnv's own server classes and driven through OpenEnv's own client.

Per rollout the bridge serves the env's app (what `openenv.core.env_server.create_app` made, or one it
makes for an `Environment` subclass) with uvicorn on a loopback port, and drives it with OpenEnv's
`GenericEnvClient` over its WebSocket protocol: `reset` at init (the task's `init_args`, e.g. a seed,
are reset's arguments), one `step` per tool call, `close` at release. Nothing of the env's is
reimplemented: a step is exactly what an OpenEnv trainer's step is.

The model acts through one tool, `step`, whose arguments are the env's action (its JSON schema comes
from the server's `/schema`); the observation, the step's reward and `done` come back as the tool's
result. The rollout's reward is the episode's return, the sum of the step rewards, as an OpenEnv
training loop adds them up. After `done`, a step is an error observation: the model should answer.
OpenEnv envs have no datasets: an env's tasks are episodes by seed (`n` of them, from `start`), whose
prompt shows the first observation through the `{observation}` placeholder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

from . import base
from .rpc import text_result

TOOL = "step"
DEFAULT_PROMPT = (
    "{description}\n\nA new episode has started. The first observation:\n{observation}\n\n"
    "Act with the `step` tool until the episode is done, then answer in one line."
)
_START_S = 30.0


def is_openenv(obj: Any) -> bool:
    """An app serving OpenEnv's protocol, or an OpenEnv `Environment` subclass."""
    module = sys.modules.get("openenv.core.env_server.interfaces")
    if module is not None and isinstance(obj, type) and issubclass(obj, module.Environment):
        return True
    paths = {getattr(route, "path", None) for route in getattr(obj, "routes", [])}
    return {"/ws", "/schema", "/reset", "/step"} <= paths


def _app(target: Any) -> Any:
    if not isinstance(target, type):
        return target
    from openenv.core.env_server import create_app

    hints = getattr(getattr(target, "step", None), "__annotations__", {})
    action, observation = hints.get("action"), hints.get("return")
    if not (isinstance(action, type) and isinstance(observation, type)):
        raise TypeError(
            f"{target.__qualname__}.step must be annotated with its Action and Observation classes "
            "(or declare the app create_app made, `module:app`)"
        )
    return create_app(target, action, observation, env_name=target.__name__)


class OpenEnvAdapter(base.Adapter):
    kind = "openenv"

    def __init__(self, target: Any, options: dict[str, Any]) -> None:
        super().__init__(target, options)
        self.app = _app(target)
        self.url = ""
        self.schema: dict[str, Any] = {}
        self.metadata: dict[str, Any] = {}
        self.client: Any = None
        self.rewards: list[float | None] = []
        self.done = False
        self._server: Any = None
        self._serving: asyncio.Future[Any] | None = None

    async def start(self) -> None:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self._serving = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        deadline = time.monotonic() + _START_S
        while not self._server.started:
            if self._serving.done():
                self._serving.result()  # raises why it stopped
                raise base.EnvFault("the OpenEnv server stopped while starting")
            if time.monotonic() > deadline:
                raise base.EnvFault(f"the OpenEnv server did not start within {_START_S:g}s")
            await asyncio.sleep(0.02)
        self.schema = await asyncio.to_thread(self._get, "/schema")
        self.metadata = await asyncio.to_thread(self._get, "/metadata")

    def _get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:  # our loopback server
            return dict(json.loads(response.read()))

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        description = str(self.metadata.get("description") or info["description"])
        info.update(description=description.splitlines()[0] if description else "", doc=description)
        return info

    async def tools(self) -> list[dict[str, Any]]:
        action = dict(self.schema.get("action") or {"type": "object", "properties": {}})
        properties = {k: v for k, v in (action.get("properties") or {}).items() if k != "metadata"}
        action["properties"] = properties
        action.pop("title", None)
        name = self.metadata.get("name") or "the environment"
        return [
            {
                "name": TOOL,
                "description": f"Take one action in {name}. Returns the observation, the step's reward and "
                "whether the episode is done.",
                "inputSchema": action,
            }
        ]

    async def init(self, rollout_id: str, args: dict[str, Any]) -> dict[str, Any]:
        del rollout_id
        from openenv.core.generic_client import GenericEnvClient

        self.client = GenericEnvClient(base_url=self.url)
        try:
            await self.client.connect()
            result = await self.client.reset(**args)
        except RuntimeError as exc:  # the server refused the reset's arguments
            raise base.BadArguments(f"reset: {exc}") from exc
        self.rewards, self.done = [], bool(result.done)
        return {"placeholders": {"observation": json.dumps(result.observation, ensure_ascii=False)}}

    async def call(self, rollout_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        del rollout_id
        if name != TOOL:
            return text_result(f"error: unknown tool {name!r}; available tools: {TOOL}", is_error=True)
        if self.done:
            return text_result("error: the episode is over (done); answer to finish", is_error=True)
        try:
            result = await self.client.step(arguments)
        except RuntimeError as exc:  # OpenEnv's client raises the server's error (an invalid action)
            return text_result(f"error: {exc}", is_error=True)
        except (ConnectionError, OSError) as exc:
            raise base.EnvFault(f"the OpenEnv server went away: {exc}") from exc
        self.rewards.append(result.reward)
        self.done = bool(result.done)
        step = {"observation": result.observation, "reward": result.reward, "done": self.done}
        return text_result(json.dumps(step, ensure_ascii=False), structured=step)

    async def reward(
        self, rollout_id: str, messages: list[dict[str, Any]], ground_truth: Any, extra: dict[str, Any]
    ) -> dict[str, Any]:
        del rollout_id, messages, ground_truth, extra
        episode_return = sum(float(r) for r in self.rewards if r is not None)
        return {"components": {"return": episode_return}, "info": {"steps": len(self.rewards), "done": self.done}}

    async def release(self, rollout_id: str) -> None:
        del rollout_id
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
            self.client = None

    async def close(self) -> None:
        await self.release("")
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._serving, 5)

    def dataset(self, name: str, options: dict[str, Any]) -> Iterator[dict[str, Any]]:
        n, start = int(options.get("n", 8)), int(options.get("start", 0))
        description = str(self.metadata.get("description") or self.metadata.get("name") or "")
        prompt = str(options.get("prompt", DEFAULT_PROMPT)).replace("{description}", description)
        for seed in range(start, start + n):
            yield {"id": f"{name}-seed-{seed}", "prompt": prompt, "init_args": {"seed": seed}}
