"""verifiers (0.4) environments, with gymflow as their agent.

A verifiers environment is a taskset package: a `Taskset` that loads typed `Task`s (the dataset),
each task's `Toolset`s (MCP servers of `@vf.tool` methods) and its `@vf.reward` / `@vf.metric`
functions (the rubric), and optionally an `Env` subclass whose `run()` drives a multi-turn exchange
through `agents.<role>.interaction(task)`. verifiers' own harnesses (agent programs it launches in a
box) are what gymflow replaces: gymflow's rollout is the agent, the model is gymflow's.

* Loading goes through verifiers' own loaders (`taskset_config_type`, `load_taskset`,
  `environment_class`), so a package loads here as `vf-eval` would load it.
* Tools: per rollout, the task's toolsets are built and set up (`setup`, `setup_task`) and registered
  on verifiers' MCP server class, called in process through its in-memory client; tools are named as
  verifiers' harnesses name them (`<server>_<tool>`). Toolset `State` is not synced across calls
  (verifiers syncs it over an HTTP state channel, which this bridge does not run).
* Reward: the conversation becomes a verifiers `Trace` (one node per message, model turns
  `sampled`), and the task scores it with its own `score()` (what `vf-replay` does offline); the
  components are the weighted rewards, so their sum is `Trace.reward`.
* Multi-turn (`Env.run` with interactions): `run()` runs in the bridge against agents whose
  `interaction(task).turn(message)` hands the message to gymflow's rollout as the env's reply to the
  model's final answer (`BaseEnv.env_turns`) and returns the model's next segment; when `run()`
  returns, the episode is over. One role plays gymflow's model (the env config's first agent, or
  `options.role`); an env that needs a second model is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from . import base
from .rpc import text_result


def _vf() -> Any:
    import verifiers.v1 as vf

    return vf


def is_verifiers(obj: Any) -> bool:
    """A verifiers `Taskset` subclass, or a module exporting one via `__all__` (a taskset package)."""
    import sys

    if "verifiers.v1" not in sys.modules:
        return False
    taskset = sys.modules["verifiers.v1"].Taskset
    if isinstance(obj, type):
        return issubclass(obj, taskset)
    if isinstance(obj, ModuleType):
        return any(
            isinstance(x, type) and issubclass(x, taskset)
            for x in map(obj.__dict__.get, obj.__dict__.get("__all__", []))
        )
    return False


class VerifiersAdapter(base.Adapter):
    kind = "verifiers"

    def __init__(self, target: Any, options: dict[str, Any]) -> None:
        super().__init__(target, options)
        vf = _vf()
        module = target if isinstance(target, ModuleType) else __import__(target.__module__, fromlist=["_"])
        self.taskset_id = str(options.get("taskset_id") or module.__name__)
        config_type = vf.taskset_config_type(self.taskset_id)
        self.taskset = vf.load_taskset(
            config_type.model_validate({"id": self.taskset_id, **options.get("taskset", {})})
        )
        self.task_cls = type(self.taskset).task_type()
        self.env_cls = vf.environment_class(self.taskset_id)
        self.multi_turn = self.env_cls is not vf.SingleAgentEnv
        self.env: Any = None
        self.role = ""
        self.task: Any = None
        self.servers: dict[str, tuple[Any, str]] = {}
        """model-facing tool name -> (in-memory MCP client, server-side name)"""
        self._tool_list: list[dict[str, Any]] | None = None
        self._clients: asyncio.Future[None] | None = None
        self._closing = asyncio.Event()
        self._episode: asyncio.Future[None] | None = None
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._reply: asyncio.Future[Any] | None = None
        self._delivered = 0
        self.messages: list[dict[str, Any]] = []
        """The conversation as of the last answer gymflow delivered (what `interaction.trace` shows)."""

    async def start(self) -> None:
        if self.multi_turn:
            vf = _vf()
            config = vf.resolve_env_config({"taskset": {"id": self.taskset_id}})
            self.env = self.env_cls(config)
            from verifiers.v1.configs.agent import agent_config_fields

            roles = list(agent_config_fields(config))
            self.role = str(self.options.get("role") or (roles[0] if roles else "agent"))
            if len(roles) > 1 and "role" not in self.options:
                raise TypeError(
                    f"{self.env_cls.__name__} has {len(roles)} agents ({', '.join(roles)}); gymflow's model plays one: "
                    "declare which with the env option `role`, and the others cannot run here"
                )

    def describe(self) -> dict[str, Any]:
        doc = (type(self.taskset).__doc__ or self.env_cls.__doc__ or "").strip()
        return {
            "description": doc.splitlines()[0] if doc else f"verifiers taskset {self.taskset_id}",
            "doc": doc,
            "system_prompt": "",
            "env_turns": self.multi_turn,
        }

    # -- tools ------------------------------------------------------------------------------------
    async def tools(self) -> list[dict[str, Any]]:
        if self._tool_list is None:
            toolsets = self.task_cls.toolsets(self.taskset.config.task)
            listed: list[dict[str, Any]] = []
            for toolset in toolsets:
                await toolset.setup()
                async with _client(_server(toolset)) as client:
                    for tool in (await client.list_tools()).tools:
                        listed.append(_tool_dict(toolset, tool))
            self._tool_list = listed
        return self._tool_list

    async def _open_tools(self) -> None:
        """The task's toolsets, set up for it and held open (by one owner task) until release."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def own() -> None:
            try:
                async with contextlib.AsyncExitStack() as stack:
                    for toolset in self.task_cls.toolsets(self.task.config):
                        await toolset.setup()
                        await toolset.setup_task(self.task)
                        client = await stack.enter_async_context(_client(_server(toolset)))
                        for tool in (await client.list_tools()).tools:
                            self.servers[_tool_dict(toolset, tool)["name"]] = (client, tool.name)
                    ready.set_result(None)
                    await self._closing.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                raise

        self._clients = asyncio.ensure_future(own())
        await ready

    async def call(self, rollout_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        del rollout_id
        route = self.servers.get(name)
        if route is None:
            return text_result(
                f"error: unknown tool {name!r}; available tools: {', '.join(self.servers)}", is_error=True
            )
        client, tool = route
        result = await client.call_tool(tool, arguments)
        texts = [getattr(block, "text", "") for block in result.content if getattr(block, "type", "") == "text"]
        structured = getattr(result, "structured_content", None)
        return text_result("\n".join(texts), is_error=bool(result.is_error), structured=structured)

    # -- the rollout ------------------------------------------------------------------------------
    async def init(self, rollout_id: str, args: dict[str, Any]) -> dict[str, Any]:
        del rollout_id
        data = args.get("vf_task")
        if not isinstance(data, dict):
            raise base.BadArguments(
                "a verifiers task needs init_args.vf_task (the task's data, as its dataset gives it)"
            )
        self.task = self.task_cls(self.task_cls.data_type().model_validate(data), self.taskset.config.task)
        await self._open_tools()
        if not self.multi_turn:
            return {}
        agents = _Agents(self.role, self)
        await self.env.setup(agents)
        self._episode = asyncio.ensure_future(self._run(agents))
        kind, value = await self._events.get()  # the env's first move: a bare turn, a message, or the end
        if kind == "error":
            raise base.EnvFault(f"{self.env_cls.__name__}.run(): {value}")
        if kind == "ask" and value is not None:
            return {"placeholders": {"opening": value}}
        if kind == "done":
            raise base.EnvFault(f"{self.env_cls.__name__}.run() ended before its first turn")
        return {}

    async def _run(self, agents: Any) -> None:
        try:
            await self.env.run(self.task, agents)
        except Exception as exc:  # the env failing is the rollout's infra failure, reported at the next respond
            await self._events.put(("error", f"{type(exc).__name__}: {exc}"))
        else:
            await self._events.put(("done", None))

    async def turn(self, message: Any) -> Any:
        """An agent's `turn(message)` inside `Env.run`: hand `message` to gymflow, wait for the model."""
        text = message if isinstance(message, str) or message is None else _text_of(message)
        self._reply = asyncio.get_running_loop().create_future()
        await self._events.put(("ask", text))
        return await self._reply

    async def respond(self, rollout_id: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        del rollout_id
        if self._episode is None or self._reply is None or self._reply.done():
            return None
        vf = _vf()
        self.messages = list(messages)
        segment = [m for m in messages[self._delivered :] if m.get("role") in {"assistant", "tool"}]
        self._delivered = len(messages)
        self._reply.set_result(vf.Segment(messages=[_vf_message(m) for m in segment]))
        kind, value = await self._events.get()
        if kind == "error":
            raise base.EnvFault(f"{self.env_cls.__name__}.run(): {value}")
        if kind == "done" or value is None:
            return None
        self._delivered += 1  # the user message gymflow appends
        return [{"role": "user", "content": value}]

    async def reward(
        self, rollout_id: str, messages: list[dict[str, Any]], ground_truth: Any, extra: dict[str, Any]
    ) -> dict[str, Any]:
        del rollout_id, ground_truth, extra
        trace = build_trace(self.task, messages, agent=self.role or "agent")
        await self.task.score(trace)
        if self.multi_turn and self.env is not None:
            vf = _vf()
            episode = vf.Episode(env=vf.EnvInfo(id=self.taskset_id), task=trace.task, traces=[trace], ok=True)
            await self.env.finalize(self.task, episode)
        components = {name: r.value for name, r in trace.rewards.items() if r is not None}
        unscored = sorted(name for name, r in trace.rewards.items() if r is None)
        if unscored:
            raise base.EnvFault(f"rewards not scored: {', '.join(unscored)}")
        return {
            "components": components,
            "info": {"metrics": {k: v for k, v in trace.metrics.items() if v is not None}},
        }

    async def release(self, rollout_id: str) -> None:
        del rollout_id
        if self._episode is not None and not self._episode.done():
            self._episode.cancel()
        self._closing.set()
        if self._clients is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._clients, 10)

    # -- data -------------------------------------------------------------------------------------
    def dataset(self, name: str, options: dict[str, Any]) -> Iterator[dict[str, Any]]:
        del options
        for task in self.taskset:
            data = task.data
            prompt: Any = data.prompt
            if prompt is None:
                prompt = "{opening}"  # the env opens the exchange (`init` fills it in)
            elif not isinstance(prompt, str):
                prompt = [{"role": m.role, "content": _text_of(m.content)} for m in prompt]
            metadata: dict[str, Any] = {"vf_key": task.key}
            if data.system_prompt:
                metadata[base.SYSTEM_PROMPT_KEY] = data.system_prompt
            yield {
                "id": str(data.id or data.name or f"{name}-{data.idx}"),
                "prompt": prompt,
                "init_args": {"vf_task": data.model_dump(mode="json", exclude_none=True)},
                "metadata": metadata,
            }


class _Agent:
    """One seat of `Env.run`'s agents, played by gymflow's model."""

    def __init__(self, adapter: VerifiersAdapter) -> None:
        self.adapter = adapter
        self.trainable = True

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any) -> Any:
        del task
        yield _Interaction(self.adapter)

    async def run(self, task: Any) -> Any:
        raise TypeError("gymflow plays this env through interactions; Agent.run is the single-agent env's")


class _Interaction:
    def __init__(self, adapter: VerifiersAdapter) -> None:
        self.adapter = adapter

    async def turn(self, message: Any = None) -> Any:
        return await self.adapter.turn(message)

    @property
    def trace(self) -> Any:
        """The exchange so far, as a verifiers Trace (rebuilt from what gymflow delivered)."""
        return build_trace(self.adapter.task, self.adapter.messages, agent=self.adapter.role)


class _Agents:
    def __init__(self, role: str, adapter: VerifiersAdapter) -> None:
        self._role = role
        self._agent = _Agent(adapter)

    def __getattr__(self, name: str) -> Any:
        if name == self.__dict__.get("_role"):
            return self.__dict__["_agent"]
        raise AttributeError(f"no agent {name!r} that gymflow can play; it plays {self.__dict__.get('_role')!r}")


def _server(toolset: Any) -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(toolset.server_name or type(toolset).__name__)
    toolset.register(server)
    return server


def _client(server: Any) -> Any:
    from mcp import Client

    return Client(server)


def _tool_dict(toolset: Any, tool: Any) -> dict[str, Any]:
    prefix = toolset.server_name
    return {
        "name": f"{prefix}_{tool.name}" if prefix else tool.name,
        "description": tool.description or "",
        "inputSchema": dict(tool.input_schema),
    }


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            getattr(part, "text", "") or (part.get("text", "") if isinstance(part, dict) else "") for part in content
        )
    return str(content or "")


def _vf_message(message: dict[str, Any]) -> Any:
    vf = _vf()
    role, content = message.get("role"), message.get("content") or ""
    if role == "system":
        return vf.SystemMessage(content=content)
    if role == "user":
        return vf.UserMessage(content=content)
    if role == "tool":
        return vf.ToolMessage(tool_call_id=message.get("tool_call_id") or "", content=content, name=message.get("name"))
    calls = [
        vf.ToolCall(id=call["id"], name=call["name"], arguments=json.dumps(call.get("arguments") or {}))
        for call in message.get("tool_calls") or []
    ]
    return vf.AssistantMessage(content=content, tool_calls=calls or None)


def build_trace(task: Any, messages: list[dict[str, Any]], *, agent: str) -> Any:
    """A verifiers Trace of the conversation: one node per message, each the next one's parent, the
    model's turns marked `sampled` (as verifiers' interception commits them)."""
    vf = _vf()
    from verifiers.v1.graph import MessageNode

    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig(), name=agent),
    )
    for index, message in enumerate(messages):
        trace.nodes.append(
            MessageNode(
                parent=index - 1 if index else None,
                message=_vf_message(message),
                sampled=message.get("role") == "assistant",
            )
        )
    trace.is_completed = trace.ok = True
    return trace
