"""A fork server for Python MCP servers: the interpreter and the server's imports, loaded once.

    python /path/to/zygote.py SOCKET TARGET_JSON

Run by path with any Python 3.9+ (an env's own venv too): it imports only the standard library.
TARGET_JSON names what it will run (`{"module": "pkg.server"}` or `{"path": "/abs/server.py"}`) and
what else to import (`extra`: module names, besides the target's own top-level imports, read from its
source). It imports those (and the MCP SDK's run-time modules when the server uses `mcp`), runs a
target's top level once when its serving is guarded by `if __name__ == "__main__":`, freezes the
heap (`gc.freeze`, so a child's garbage collector leaves the shared pages alone), then writes
`ready PID` on stdout, or `refused: REASON` and exits when forking would not be safe (an import
started a thread).

Each spawn is one connection to SOCKET: a length-prefixed JSON request (`args`, `env`, `cwd`,
`nice`) with three file descriptors (the child's stdin, stdout and stderr). The fork server forks,
answers `pid N`, and when that child exits writes `exit CODE` (negative: killed by that signal) and
closes the connection. The child is its own session (a process group the host can kill), in its own
working directory, with exactly the environment it was given and its own copy of everything
else: nothing of one child is visible to another. The fork server exits when its parent (the worker)
does; its children do not, they end when the worker's end of their stdin closes, as a plain server does.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import traceback
from typing import Any

_HEADER = struct.Struct("!I")
MAX_REQUEST_BYTES = 4 << 20
MCP_RUNTIME = (
    "anyio._backends._asyncio",
    "anyio._core._sockets",
    "anyio.streams.stapled",
    "anyio.streams.tls",
    "mcp.server.stdio",
)
"""What an MCP server imports only once it runs (its event loop, its stdio streams): loaded here too
when the server's imports brought in `mcp`, so no child imports them on its own pages."""


def main(argv: list[str]) -> int:
    socket_path, target = argv[0], json.loads(argv[1])
    _die_with_parent()
    # Imports resolve as the child's will: beside the script, or (for `-m`) not in this file's folder.
    sys.path[0] = os.path.dirname(target["path"]) if target.get("path") else os.getcwd()
    problem = preload(target)
    if problem:
        print(f"refused: {problem}", flush=True)
        return 3
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(128)
    gc.collect()
    gc.freeze()
    print(f"ready {os.getpid()}", flush=True)
    serve(listener, target)
    return 0


def preload(target: dict[str, Any]) -> str | None:
    """Import what the target's children will need; a reason when forking would be unsafe."""
    _import_all([*imports_of(target), *target.get("extra", [])])
    if "mcp" in sys.modules:  # an MCP server: what it imports once it runs, too
        _import_all(MCP_RUNTIME)
    if target.get("warm", True) and _guarded(_source_of(target)):
        _warm(target)
    if threading.active_count() > 1:
        running = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return f"importing the server started threads ({running}), which a fork would not carry"
    return None


def _import_all(names: list[str] | tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # the child imports it again and says why
            print(f"preload of {name} failed: {exc!r}", file=sys.stderr, flush=True)


def _warm(target: dict[str, Any]) -> None:
    """Run the target's top level once, not as `__main__`: what building its tools caches (pydantic's
    schemas, say) is then built here, in pages the children share, and each child's own run is cheaper."""
    import runpy

    try:
        if target.get("module"):
            runpy.run_module(target["module"], run_name="__gymflow_warm__")
        else:
            runpy.run_path(target["path"], run_name="__gymflow_warm__")
    except BaseException as exc:  # the child runs it again and says why
        print(f"warming {target} failed: {exc!r}", file=sys.stderr, flush=True)


def _source_of(target: dict[str, Any]) -> ast.Module | None:
    """The parsed source of the target, if it is a Python file that can be read."""
    source_path = target.get("path")
    if target.get("module"):
        try:
            spec = importlib.util.find_spec(target["module"])
            if spec is not None and spec.submodule_search_locations is not None:  # a package runs its __main__
                spec = importlib.util.find_spec(target["module"] + ".__main__")
        except (ImportError, ValueError):
            spec = None
        source_path = spec.origin if spec is not None and spec.has_location else None
    if not source_path or not str(source_path).endswith(".py"):
        return None
    try:
        with open(source_path, "rb") as handle:
            return ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return None


def _guarded(tree: ast.Module | None) -> bool:
    """Whether the source runs its server only under `if __name__ == "__main__":` (so its top level
    can run here without serving)."""
    if tree is None:
        return False
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            left, right = node.test.left, node.test.comparators
            names = [left, *right]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(
                isinstance(n, ast.Constant) and n.value == "__main__" for n in names
            ):
                return True
    return False


def imports_of(target: dict[str, Any]) -> list[str]:
    """The modules a server's source imports at top level, its package first (relative imports of a
    module target resolved against its package)."""
    names: list[str] = []
    module = target.get("module") or ""
    package = module if _is_package(module) else module.rpartition(".")[0]
    if package:
        names.append(package)
    tree = _source_of(target)
    if tree is None:
        return names
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if node.level == 0 and node.module:
                names.append(node.module)
            elif node.level > 0 and package:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                if node.module:
                    names.append(f"{base}.{node.module}")
                else:
                    names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def _is_package(module: str) -> bool:
    try:
        spec = importlib.util.find_spec(module) if module else None
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.submodule_search_locations is not None


def serve(listener: socket.socket, target: dict[str, Any]) -> None:
    """Accept spawn requests until the parent goes; report each child's exit on its connection."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                pid = spawn(conn, target, closing=[listener, wake_r, wake_w, selector, *children.values()])
                if pid is not None:
                    children[pid] = conn
            else:
                os.read(wake_r, 4096)
        reap(children)


def reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(Exception):  # the host has gone, or stopped listening
                conn.sendall(f"exit {code}\n".encode())
            conn.close()


def spawn(conn: socket.socket, target: dict[str, Any], *, closing: list[Any]) -> int | None:
    """Read one request, fork its child; the child's pid, or None when the request was bad."""
    fds: list[int] = []
    try:
        conn.settimeout(10)
        request, fds = _receive(conn)
        pid = os.fork()
    except (OSError, ValueError) as exc:
        with contextlib.suppress(Exception):
            conn.sendall(f"error {exc}\n".encode())
        conn.close()
        for fd in fds:
            os.close(fd)
        return None
    if pid == 0:
        _become_child(request, fds, target, closing=[conn, *closing])
    for fd in fds:
        os.close(fd)
    conn.sendall(f"pid {pid}\n".encode())
    return pid


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
    fds = list(fds)
    while len(data) < _HEADER.size:
        more = conn.recv(65536)
        if not more:
            raise ValueError("the spawn request ended early")
        data += more
    (size,) = _HEADER.unpack_from(data)
    if size > MAX_REQUEST_BYTES:
        raise ValueError(f"a spawn request of {size} bytes is over the {MAX_REQUEST_BYTES} limit")
    if len(fds) != 3:
        raise ValueError(f"a spawn request carries 3 file descriptors (stdin, stdout, stderr), got {len(fds)}")
    body = data[_HEADER.size :]
    while len(body) < size:
        more = conn.recv(65536)
        if not more:
            raise ValueError("the spawn request ended early")
        body += more
    return json.loads(body), fds


def _become_child(request: dict[str, Any], fds: list[int], target: dict[str, Any], *, closing: list[Any]) -> None:
    """In the forked child: take the given stdio, directory and environment, then run the target."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for item in closing:
            with contextlib.suppress(Exception):
                item.close() if hasattr(item, "close") else os.close(item)
        os.setsid()
        for number, fd in enumerate(fds):
            os.dup2(fd, number)
        os.closerange(3, _max_fd())
        if request.get("nice"):
            os.nice(int(request["nice"]))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _fresh_stdio()
        code = _run(target, list(request.get("args", [])), request["cwd"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:  # a child never returns into the fork server's loop
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run(target: dict[str, Any], args: list[str], cwd: str) -> int:
    import runpy

    if target.get("module"):
        sys.argv = [target["module"], *args]
        sys.path[0] = cwd  # as `python -m` puts the working directory first
        runpy.run_module(target["module"], run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target["path"], *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target["path"]))
        runpy.run_path(target["path"], run_name="__main__")
    return 0


def _fresh_stdio() -> None:
    """New sys.stdin/stdout/stderr on fds 0-2, with nothing buffered from the fork server."""
    import io

    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536


def _die_with_parent() -> None:
    """Exit (SIGKILL) when the worker that started us dies, so no fork server outlives it."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
