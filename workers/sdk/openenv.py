"""Any gymflow env over OpenEnv's protocol: OpenEnv clients (and the trainers built on them) drive it.

OpenEnv's wire, as its server classes serve it and its `EnvClient` speaks it: a WebSocket at `/ws`
carrying `{"type": "reset" | "step" | "state" | "close", "data": ...}` and answered with
`{"type": "observation", "data": {"observation", "reward", "done"}}`, `{"type": "state", "data"}` or
`{"type": "error", "data": {"message", "code"}}`; and HTTP `POST /reset`, `POST /step`, `GET /state`,
`GET /health`, `GET /metadata`, `GET /schema`.

Each episode is a durable gymflow session (`RolloutSessionWorkflow`): `reset` starts one and returns
its first observation, each `step` is one of its updates, `close` (or a new `reset`) closes it. So a
worker that dies mid-episode costs a step a recovery on another node, never the episode; the server
holds no env state itself, only which session a connection drives. A `reset` naming an
`episode_id` that is already running re-attaches to it (a client that reconnected), and HTTP steps
name their episode by `episode_id`.

Action: one assistant turn, `{"text": "..."}` (hermes `<tool_call>` blocks are parsed) or
`{"message": {...}}` (an assistant message with tool calls). Observation: the turn's tool (or env)
messages, and at reset the system prompt, the opening messages and the tools (OpenAI format). The
reward is the episode's, given with the step that ends it (None before). `reset` picks the task by
`task_id`, else by `seed` (index into the env's dataset), else the next one in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import itertools
import json
import socket
import sys
from collections.abc import Sequence
from typing import Any, Self

from aiohttp import WSMsgType, web
from pydantic import ValidationError
from temporalio.client import Client, WorkflowExecutionStatus

from gymflow.activities import names
from gymflow.activities.session_schema import ResetResult, SessionInput, StepInput, StepResult
from gymflow.envs.contract import Task
from gymflow.envs.errors import ExporterError, SessionError
from gymflow.envs.registry import env_class
from gymflow.workers.sdk.sessions import Session, attach_session, start_session

EPISODE_PREFIX = "openenv-"
"""Session workflow ids are `openenv-<episode id>`."""


def _observation(data: dict[str, Any], *, reward: float | None = None, done: bool = False) -> dict[str, Any]:
    return {"observation": data, "reward": reward, "done": done}


def reset_observation(reset: ResetResult, task: Task) -> dict[str, Any]:
    return _observation(
        {
            "episode_id": reset.session_id.removeprefix(EPISODE_PREFIX),
            "task_id": task.id,
            "system_prompt": reset.system_prompt,
            "messages": [m.model_dump(mode="json", exclude_defaults=True) for m in reset.messages],
            "tools": [t.to_openai() for t in reset.tools],
            "turn": 0,
            "node_id": reset.node_id,
        }
    )


def step_observation(result: StepResult) -> dict[str, Any]:
    data: dict[str, Any] = {
        "messages": [m.model_dump(mode="json", exclude_defaults=True) for m in result.observations],
        "turn": result.turn,
    }
    if result.done:
        data.update(termination=result.termination, infra_failed=result.infra_failed, error=result.error)
    reward = result.reward.total if result.reward is not None else None
    return _observation(data, reward=reward, done=result.done)


class Episode:
    """One OpenEnv episode: a session and the task it plays."""

    def __init__(self, session: Session, task: Task | None) -> None:
        self.session = session
        self.task = task
        self.steps = 0
        self.done = False


class OpenEnvExporter:
    """Serves env `env` over OpenEnv's protocol; episodes run as sessions on `task_queue`.

    Args:
        client: Temporal client (the pydantic data converter).
        env: The env to serve (any gymflow env name).
        tasks: The tasks resets choose from (default: the env's `dataset`).
        template: Limits, retries and idle timeout of every session (its env and task are replaced).
    """

    def __init__(
        self,
        client: Client,
        *,
        env: str,
        task_queue: str = names.TASK_QUEUE,
        tasks: Sequence[Task] | None = None,
        dataset: str = "generated",
        template: SessionInput | None = None,
    ) -> None:
        self.client = client
        self.env = env
        self.task_queue = task_queue
        self.cls = env_class(env)
        self.tasks = list(tasks) if tasks is not None else list(self.cls.load_dataset(dataset))
        if not self.tasks:
            raise ValueError(f"{env} has no tasks to reset to (dataset {dataset!r})")
        self.template = template or SessionInput(env=env, task=self.tasks[0])
        self._turn = itertools.count()
        self._episodes: dict[str, Episode] = {}
        """HTTP episodes by episode id (WebSocket connections hold their own)."""
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- episodes -------------------------------------------------------------------------------
    def pick(self, data: dict[str, Any]) -> Task:
        """The task a reset asks for: `task_id`, else `seed` (an index, modulo), else the next one."""
        if "task_id" in data:
            found = next((t for t in self.tasks if t.id == str(data["task_id"])), None)
            if found is None:
                raise ExporterError(f"{self.env} has no task {data['task_id']!r}")
            return found
        if data.get("seed") is not None:
            return self.tasks[int(data["seed"]) % len(self.tasks)]
        return self.tasks[next(self._turn) % len(self.tasks)]

    async def reset(self, data: dict[str, Any]) -> tuple[Episode, dict[str, Any]]:
        """Start (or, for a running `episode_id`, re-attach to) an episode; its first observation."""
        episode_id = data.get("episode_id")
        if episode_id is not None:
            running = await self._running(str(episode_id))
            if running is not None:
                progress = await running.handle.query("progress")
                episode = Episode(running, None)
                episode.steps = int(progress.get("turns", 0))
                state = {"episode_id": str(episode_id), "resumed": True, "turn": episode.steps}
                return episode, _observation(state, done=bool(progress.get("done")))
        task = self.pick(data)
        session = await start_session(
            self.client,
            self.template.model_copy(update={"env": self.env, "task": task}),
            task_queue=self.task_queue,
            workflow_id=f"{EPISODE_PREFIX}{episode_id}" if episode_id is not None else None,
        )
        first = await session.reset()
        return Episode(session, task), reset_observation(first, task)

    async def _running(self, episode_id: str) -> Session | None:
        session = attach_session(self.client, f"{EPISODE_PREFIX}{episode_id}")
        try:
            described = await session.handle.describe()
        except Exception:  # no such workflow (RPCError NOT_FOUND): a new episode under that id
            return None
        return session if described.status == WorkflowExecutionStatus.RUNNING else None

    async def step(self, episode: Episode, action: dict[str, Any]) -> dict[str, Any]:
        if episode.done:
            raise ExporterError("the episode is over (done): reset to start another")
        turn = StepInput.model_validate({k: v for k, v in action.items() if k != "metadata"})
        result = await episode.session.step(turn.message, text=turn.text)
        episode.steps = result.turn
        episode.done = result.done
        return step_observation(result)

    async def state(self, episode: Episode | None) -> dict[str, Any]:
        if episode is None:
            return {"episode_id": None, "step_count": 0}
        progress = await episode.session.handle.query("progress")
        return {
            "episode_id": episode.session.id.removeprefix(EPISODE_PREFIX),
            "step_count": int(progress.get("turns", 0)),
            "task_id": episode.task.id if episode.task else None,
            "env": self.env,
            **{k: v for k, v in progress.items() if k != "turns"},
        }

    async def close(self, episode: Episode | None) -> None:
        if episode is not None and not episode.done:
            with contextlib.suppress(SessionError):
                await episode.session.close()

    # -- HTTP and WebSocket ---------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.get("/ws", self._ws),
                web.get("/health", self._health),
                web.get("/metadata", self._metadata),
                web.get("/schema", self._schema),
                web.post("/reset", self._http_reset),
                web.post("/step", self._http_step),
                web.get("/state", self._http_state),
            ]
        )
        return app

    async def _health(self, request: web.Request) -> web.Response:
        del request
        return web.json_response({"status": "healthy"})

    async def _metadata(self, request: web.Request) -> web.Response:
        del request
        doc = (self.cls.__doc__ or "").strip()
        ref = self.cls.package
        version = ref.version if ref is not None else importlib.metadata.version("gymflow")
        return web.json_response(
            {"name": self.env, "description": doc.splitlines()[0] if doc else self.env, "version": version}
        )

    async def _schema(self, request: web.Request) -> web.Response:
        del request
        observation = {"type": "object", "properties": {"messages": {"type": "array"}, "turn": {"type": "integer"}}}
        return web.json_response(
            {"action": StepInput.model_json_schema(), "observation": observation, "state": {"type": "object"}}
        )

    async def _http_reset(self, request: web.Request) -> web.Response:
        data = await _body(request)
        try:
            episode, answer = await self.reset(data)
        except (ExporterError, SessionError) as exc:
            return web.json_response({"detail": str(exc)}, status=400)
        self._episodes[episode.session.id.removeprefix(EPISODE_PREFIX)] = episode
        return web.json_response(answer)

    async def _http_step(self, request: web.Request) -> web.Response:
        data = await _body(request)
        episode = self._episodes.get(str(data.get("episode_id")))
        if episode is None:
            return web.json_response(
                {"detail": "name a running episode: `episode_id` as /reset answered it"}, status=400
            )
        try:
            answer = await self.step(episode, dict(data.get("action") or {}))
        except ValidationError as exc:
            return web.json_response({"detail": exc.errors(include_url=False)}, status=422)
        except (ExporterError, SessionError) as exc:
            return web.json_response({"detail": str(exc)}, status=409)
        return web.json_response(answer)

    async def _http_state(self, request: web.Request) -> web.Response:
        return web.json_response(await self.state(self._episodes.get(request.query.get("episode_id", ""))))

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        socket_ = web.WebSocketResponse(max_msg_size=100 * 1024 * 1024)
        await socket_.prepare(request)
        episode: Episode | None = None
        try:
            async for raw in socket_:
                if raw.type != WSMsgType.TEXT:
                    continue
                try:
                    message = json.loads(raw.data)
                except ValueError as exc:
                    await socket_.send_json(_error(f"Invalid JSON: {exc}", "INVALID_JSON"))
                    continue
                kind, data = message.get("type"), message.get("data") or {}
                try:
                    if kind == "reset":
                        await self.close(episode)
                        episode, answer = await self.reset(data)
                        await socket_.send_json({"type": "observation", "data": answer})
                    elif kind == "step":
                        answer = (
                            _error("reset before the first step", "EXECUTION_ERROR")
                            if episode is None
                            else {"type": "observation", "data": await self.step(episode, data)}
                        )
                        await socket_.send_json(answer)
                    elif kind == "state":
                        await socket_.send_json({"type": "state", "data": await self.state(episode)})
                    elif kind == "close":
                        await self.close(episode)
                        episode = None
                        break
                    else:
                        await socket_.send_json(_error(f"Unknown message type: {kind}", "UNKNOWN_TYPE"))
                except ValidationError as exc:
                    await socket_.send_json(_error(f"Invalid action: {exc}", "VALIDATION_ERROR"))
                except (ExporterError, SessionError) as exc:
                    await socket_.send_json(_error(str(exc), "EXECUTION_ERROR"))
        finally:
            if not socket_.closed:
                await socket_.close()
        return socket_

    # -- serving ----------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on `host:port` (0: a free port) in this event loop; the base URL."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.port = sock.getsockname()[1]
        self._runner = web.AppRunner(self.app(), handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    with contextlib.suppress(ValueError):
        body = await request.json()
        return dict(body) if isinstance(body, dict) else {}
    return {}


def _error(message: str, code: str) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code}}


def serve_from_cli(args: Any) -> int:
    """`gymflow envs serve NAME`: serve until interrupted (a worker must run the sessions)."""
    from gymflow.workers.client import connect, data_converter
    from gymflow.workers.config import Settings

    overrides = {k: v for k, v in {"temporal_address": args.address, "task_queue": args.task_queue}.items() if v}
    settings = Settings(**overrides)

    async def serve() -> None:
        client = await connect(
            settings.temporal_address, namespace=settings.namespace, data_converter=data_converter(settings)
        )
        exporter = OpenEnvExporter(client, env=args.env, task_queue=settings.task_queue, dataset=args.dataset)
        url = await exporter.start(args.host, args.port)
        print(
            f"serving {args.env} over OpenEnv's protocol at {url} (WebSocket {url.replace('http', 'ws', 1)}/ws); "
            f"episodes run as sessions on task queue {settings.task_queue}",
            file=sys.stderr,
        )
        try:
            await asyncio.Event().wait()
        finally:
            await exporter.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0
