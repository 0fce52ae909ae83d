"""An OpenEnv client driving an env server, one command per stdin line (run with an OpenEnv venv's python).

`python openenv_driver.py BASE_URL`; each line is `{"op": "reset" | "step" | "state" | "close", ...}`
(`data` for reset, `action` for step) and gets one JSON line back: the `StepResult` OpenEnv's
`GenericEnvClient` returned (`observation`, `reward`, `done`), the state, or `{"error": ...}`.
"""

import asyncio
import json
import sys

from openenv.core.generic_client import GenericEnvClient


async def main(base_url: str) -> None:
    loop = asyncio.get_running_loop()
    async with GenericEnvClient(base_url=base_url, message_timeout_s=300) as env:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = json.loads(line)
            try:
                if command["op"] == "reset":
                    result = await env.reset(**command.get("data", {}))
                    answer = {"observation": result.observation, "reward": result.reward, "done": result.done}
                elif command["op"] == "step":
                    result = await env.step(command["action"])
                    answer = {"observation": result.observation, "reward": result.reward, "done": result.done}
                elif command["op"] == "state":
                    answer = {"state": await env.state()}
                else:
                    break
            except Exception as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(answer), flush=True)


asyncio.run(main(sys.argv[1]))
