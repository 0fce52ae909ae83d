"""Task images: built once per node from a build context, and base images made without a registry.

* An image's tag is the content hash of its build context (every file's relative path, mode and
  bytes, plus the Dockerfile), so an unchanged task is never rebuilt and a changed one never runs a
  stale image: `localhost/gymflow/<name>:<hash>`.
* One build per image per node: concurrent builders in a process wait on one `asyncio.Lock`, and
  builders in other processes of the node wait on a lock file (`flock`) in the node's state
  directory; whoever gets the lock second finds the image built. A build has a time limit (the
  task's `build_timeout_sec`); past it the build's process group is killed and `BuildError` raised.
* Nodes here reach no image registry. Builds run with `--pull=never`, and a `FROM` image that is not
  on the node is made locally when gymflow knows how (`BASE_IMAGES`: Debian suites from Debian's own
  packages with `mmdebstrap --variant=minbase`, imported under the name Docker Hub gives them, so
  `FROM debian:bookworm-slim` resolves to it). Any other missing base is a `BuildError` naming it:
  such images are for the user's registry (`podman pull`/`load` on the node). `RUN apt-get ...`
  lines still work: builds have a network, rollouts do not.
* A node with both engines moves a base image the other engine already has (`save` then `load`,
  seconds) before it bootstraps one (minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from gymflow.envs.errors import BuildError, EngineError, EngineUnavailable
from gymflow.envs.runtime.engine import LABEL_MARKER, Engine

BASE_IMAGES: dict[str, str] = {
    "docker.io/library/debian:bookworm-slim": "bookworm",
    "docker.io/library/debian:bookworm": "bookworm",
    "docker.io/library/debian:12-slim": "bookworm",
    "docker.io/library/debian:12": "bookworm",
}
"""Base images gymflow bootstraps from Debian's packages: the full name -> the Debian suite."""
BOOTSTRAP_TIMEOUT_S = 900.0
DEFAULT_BUILD_TIMEOUT_S = 600.0
_LOCK_POLL_S = 0.2

_locks: dict[str, asyncio.Lock] = {}


def full_name(ref: str) -> str:
    """A short image name as Docker Hub spells it in full (`debian:bookworm-slim` -> docker.io/library/...)."""
    name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "")
    name = name or ref
    if "/" not in name:
        name = f"library/{name}"
    first = name.split("/", 1)[0]
    if "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    return f"{name}:{tag or 'latest'}" if "@" not in name else name


def base_images(dockerfile: str) -> list[str]:
    """The external images a Dockerfile builds `FROM` (earlier stages' names excluded)."""
    stages: set[str] = set()
    bases: list[str] = []
    for line in _logical_lines(dockerfile):
        words = line.split()
        if not words or words[0].upper() != "FROM":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if not args:
            raise BuildError(f"a FROM line without an image: {line!r}")
        image = args[0]
        if image.lower() not in stages and image != "scratch":
            bases.append(image)
        if len(args) >= 3 and args[1].upper() == "AS":
            stages.add(args[2].lower())
    return bases


def context_hash(context: Path, dockerfile: Path) -> str:
    """A hash of the build context's files (paths, modes, bytes) and of the Dockerfile."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(context).as_posix()
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        digest.update(f"{rel}\0{path.lstat().st_mode:o}\0{len(data)}\0".encode())
        digest.update(data)
    digest.update(b"\0dockerfile\0" + dockerfile.read_bytes())
    return digest.hexdigest()[:16]


def image_ref(name: str, context: Path, dockerfile: Path) -> str:
    """The tag a build context gets."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "task"
    return f"localhost/gymflow/{slug}:{context_hash(context, dockerfile)}"


async def build_image(
    engine: Engine,
    *,
    name: str,
    context: Path,
    dockerfile: Path | None = None,
    timeout_s: float = DEFAULT_BUILD_TIMEOUT_S,
    state_dir: Path,
) -> str:
    """Build the image of `context` once per node and return its reference.

    Args:
        engine: The engine to build with.
        name: A readable name for the tag (the task's).
        context: The build context directory.
        dockerfile: Default `context/Dockerfile`.
        timeout_s: Limit of the build itself (a missing base's bootstrap has its own).
        state_dir: The node's runtime directory (lock files live there).

    Raises:
        BuildError: The build failed, timed out, or needs a base image gymflow cannot make.
    """
    dockerfile = dockerfile or context / "Dockerfile"
    if not dockerfile.is_file():
        raise BuildError(f"no Dockerfile at {dockerfile}")
    ref = image_ref(name, context, dockerfile)
    if await engine.image_exists(ref):
        return ref
    async with node_lock(ref, state_dir, timeout_s=timeout_s + BOOTSTRAP_TIMEOUT_S):
        if await engine.image_exists(ref):
            return ref
        for base in base_images(dockerfile.read_text()):
            await ensure_base(engine, base, state_dir=state_dir)
        pull = ["--pull=never"] if engine.kind == "podman" else []
        args = ["build", *pull, "--label", f"{LABEL_MARKER}=1", "-t", ref, "-f", str(dockerfile), str(context)]
        try:
            done = await engine.run(args, timeout_s=timeout_s, check=False)
        except EngineError:
            raise BuildError(f"building {name!r} ({context}) timed out after {timeout_s:g}s") from None
        if done.returncode != 0:
            tail = (done.stderr.strip() or done.stdout.strip())[-3000:]
            raise BuildError(f"building {name!r} ({context}) failed: {tail}")
    return ref


async def ensure_base(engine: Engine, ref: str, *, state_dir: Path) -> None:
    """Make sure base image `ref` is on the node, bootstrapping it from Debian when gymflow can.

    Raises:
        BuildError: It is missing and not one gymflow can make (the message names it).
    """
    if "$" in ref:
        raise BuildError(f"base image {ref!r} uses a build argument; gymflow cannot tell which image to provide")
    if await engine.image_exists(ref):
        return
    name = full_name(ref)
    suite = BASE_IMAGES.get(name)
    if suite is None:
        raise BuildError(
            f"base image {ref!r} is not on this node and no registry is reachable to pull it: "
            f"load it on the node (`{engine.kind} load` or a pull from your registry); gymflow itself makes "
            f"only {', '.join(sorted(BASE_IMAGES))}"
        )
    async with node_lock(name, state_dir, timeout_s=BOOTSTRAP_TIMEOUT_S):
        if not await engine.image_exists(name) and not await copy_from_sibling(engine, name):
            await bootstrap_debian(engine, name, suite=suite)


async def copy_from_sibling(engine: Engine, ref: str) -> bool:
    """Load `ref` from the node's other engine (podman <-> docker) when it has it; False when it has not."""
    try:
        other = Engine.detect("docker" if engine.kind == "podman" else "podman")
    except EngineUnavailable:
        return False
    if other.kind == engine.kind or not await other.image_exists(ref):
        return False
    with tempfile.TemporaryDirectory(prefix="gymflow-image-") as tmp:
        archive = str(Path(tmp) / "image.tar")
        await other.run(["save", "-o", archive, ref], timeout_s=300)
        await engine.run(["load", "-i", archive], timeout_s=300)
    return await engine.image_exists(ref)


async def bootstrap_debian(engine: Engine, ref: str, *, suite: str, timeout_s: float = BOOTSTRAP_TIMEOUT_S) -> None:
    """Build a minimal Debian image from Debian's packages (mmdebstrap) and import it as `ref`."""
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise BuildError(f"base image {ref!r} is missing and mmdebstrap is not installed (apt-get install mmdebstrap)")
    with tempfile.TemporaryDirectory(prefix="gymflow-base-") as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        process = await asyncio.create_subprocess_exec(
            mmdebstrap, "--variant=minbase", "--quiet", suite, str(tarball),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            _, err = await asyncio.wait_for(process.communicate(), timeout_s)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 9)
            await process.wait()
            raise
        if process.returncode != 0:
            raise BuildError(f"mmdebstrap {suite} failed: {err.decode(errors='replace')[-2000:]}")
        changes = [
            "--change",
            'CMD ["bash"]',
            "--change",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ]
        await engine.run(["import", *changes, str(tarball), ref], timeout_s=300)


@contextlib.asynccontextmanager
async def node_lock(key: str, state_dir: Path, *, timeout_s: float) -> AsyncIterator[None]:
    """Hold the node-wide lock named `key` (in this process and across the node's processes)."""
    lock = _locks.setdefault(key, asyncio.Lock())
    async with lock:
        locks = state_dir / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        path = locks / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".lock")
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise BuildError(f"waited {timeout_s:g}s for another process building {key}") from None
                    await asyncio.sleep(_LOCK_POLL_S)  # another process of the node holds it
            yield
        finally:
            os.close(fd)


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") and not current:
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines
