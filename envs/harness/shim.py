"""The container-engine shim: an agent that runs its commands with `docker` gets the rollout's container.

Agents such as mini-swe-agent act on a task by starting a container of their own (``docker run -d
... IMAGE sleep 2h``), running each command with ``docker exec -w DIR -e K=V ID bash -lc CMD`` and
removing the container at the end. A Harbor rollout already has its container: built from the task's
image, with the task's limits, no network, and the rollout's workspace at /logs, where the verifier
will look. So the program's PATH starts with a directory holding this shim as ``docker`` (and
``podman``), and

* ``run`` starts nothing and prints the rollout's container name (``GYMFLOW_CONTAINER``);
* ``exec`` runs the command in the rollout's container through the node's engine
  (``GYMFLOW_CONTAINER_ENGINE``), whichever container id it was given, keeping the working
  directory, variables, ``-i`` and ``-t``;
* ``stop``, ``rm`` and ``kill`` do nothing: the rollout releases its container after the verifier;
* ``inspect`` and ``ps`` are answered by the engine for the rollout's container only; anything else
  is refused with exit status 125 (the engine's own code for "the command could not run").

The agent is not modified, nor configured beyond its usual docker settings, and it never sees a
second container, the engine's other containers or the host's network. A command an agent times
out is killed with the shim (``podman exec``'s client); the process inside lives until the rollout's
container is released.

The shim is a small Python program run by the worker's own interpreter (``-I``: isolated, no site
packages), written into the program's directory when the program starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

CONTAINER_VAR = "GYMFLOW_CONTAINER"
ENGINE_VAR = "GYMFLOW_CONTAINER_ENGINE"
NAMES = ("docker", "podman")
"""The executables the shim stands in for on the program's PATH."""

SCRIPT = '''\
"""gymflow's container-engine shim (gymflow.envs.harness.shim): the rollout's container, and only it."""
import os
import sys

VALUED = {"-w", "--workdir", "-e", "--env", "-u", "--user", "--env-file"}
FLAGS = {"-i", "--interactive", "-t", "--tty", "-it", "-ti", "-d", "--detach", "--privileged"}


def refuse(message):
    sys.stderr.write("gymflow engine shim: " + message + "\\n")
    sys.exit(125)


def main():
    container = os.environ.get("GYMFLOW_CONTAINER")
    engine = os.environ.get("GYMFLOW_CONTAINER_ENGINE")
    if not container or not engine:
        refuse("GYMFLOW_CONTAINER and GYMFLOW_CONTAINER_ENGINE are not set: this program runs outside a rollout")
    args = sys.argv[1:]
    if not args:
        refuse("usage: docker run|exec|stop|rm|kill|inspect|ps ...")
    command, rest = args[0], args[1:]
    if command in ("run", "create"):
        print(container)
        return
    if command in ("stop", "rm", "kill", "start"):
        return
    if command == "exec":
        options, index = [], 0
        while index < len(rest) and rest[index].startswith("-"):
            option = rest[index]
            if option in VALUED:
                if index + 1 >= len(rest):
                    refuse("exec: " + option + " needs a value")
                options += [option, rest[index + 1]]
                index += 2
            elif option in FLAGS or option.split("=", 1)[0] in VALUED:
                options.append(option)
                index += 1
            else:
                refuse("exec: option " + option + " is not supported")
        if index + 1 >= len(rest):
            refuse("exec: needs a container and a command")
        os.execv(engine, [engine, "exec", *options, container, *rest[index + 1 :]])
    if command in ("inspect", "ps"):
        target = ["--filter", "name=^" + container + "$"] if command == "ps" else [container]
        os.execv(engine, [engine, command, *[a for a in rest if a.startswith("-")], *target])
    refuse("`" + command + "` is not available: the rollout owns its container")


main()
'''


def install(directory: Path, *, python: str | None = None) -> Path:
    """Write the shim into `directory` as `docker` and `podman`; returns the directory (for PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    body = f"#!{python or sys.executable} -I\n{SCRIPT}"
    for name in NAMES:
        path = directory / name
        path.write_text(body)
        path.chmod(0o755)
    return directory
