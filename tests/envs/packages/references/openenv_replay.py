"""OpenEnv's own loop on the actions gymflow recorded (run with the package's python): the env's app
served by uvicorn, OpenEnv's `GenericEnvClient` resetting to each episode's seed and stepping
its actions; an episode's return is the sum of its step rewards. Reads `{"app", "episodes":
[{"seed", "actions"}]}` on stdin, prints the returns as JSON."""

import asyncio
import importlib
import json
import socket
import sys

import uvicorn
from openenv.core.generic_client import GenericEnvClient


async def main() -> None:
    job = json.load(sys.stdin)
    module, _, name = job["app"].partition(":")
    app = getattr(importlib.import_module(module), name)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    for _ in range(1500):  # 30 s
        if server.started:
            break
        await asyncio.sleep(0.02)
    returns = []
    for episode in job["episodes"]:
        async with GenericEnvClient(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}") as env:
            await env.reset(seed=episode["seed"])
            total = 0.0
            for action in episode["actions"]:
                result = await env.step(action)
                total += result.reward or 0.0
            returns.append(total)
    server.should_exit = True
    await serving
    print(json.dumps(returns), flush=True)


asyncio.run(main())
