"""The values of a compose file: variables interpolated, durations, sizes, argv, environments, volumes.

Helpers of gymflow.envs.runtime.compose, which says what is read and what refused; each takes the
place in the file (`where`) it reads for its `ComposeError`s.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gymflow.envs.errors import ComposeError

COMPOSE_FILE = "docker-compose.yaml"
_VARIABLE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
_BYTES = re.compile(r"^(\d+(?:\.\d+)?)\s*([bkmg]?)b?$", re.IGNORECASE)


def interpolate(value: str, variables: Mapping[str, str], *, where: str = COMPOSE_FILE) -> str:
    """`${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?message}`, `$VAR`, `$$` in `value`."""

    def replace(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        expr = match.group("braced")
        if expr is None:
            expr = match.group("named")
        name, op, rest = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)(:?[-?]|)(.*)$", expr, re.S).groups()  # type: ignore[union-attr]
        if not name:
            raise ComposeError(f"{where}: invalid variable ${{{expr}}}")
        value = variables.get(name)
        if op in (":-", "-"):
            unset = value is None or (op == ":-" and value == "")
            return interpolate(rest, variables, where=where) if unset else str(value)
        if op in (":?", "?"):
            if value is None or (op == ":?" and value == ""):
                raise ComposeError(f"{where}: variable {name} is required: {rest or 'not set'}")
            return str(value)
        if op or rest:
            raise ComposeError(f"{where}: invalid variable ${{{expr}}}")
        if value is None:
            raise ComposeError(f"{where}: variable {name} is not set and has no default (write ${{{name}:-}})")
        return str(value)

    if re.search(r"\$\{[^}]*$", value):
        raise ComposeError(f"{where}: unterminated ${{ in {value!r}")
    return _VARIABLE.sub(replace, value)


def parse_duration(value: object, *, where: str) -> float:
    """A Compose duration (`1m30s`, `500ms`, `2h`; a bare number is seconds) in seconds."""
    if isinstance(value, bool):
        raise ComposeError(f"{where}: {value!r} is not a duration")
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ComposeError(f"{where}: {value!r} is not a duration (like 30s, 1m30s, 500ms)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def parse_bytes(value: object, *, where: str) -> int:
    """A memory size (`512m`, `1g`, `1GB`, a number of bytes) in bytes."""
    match = _BYTES.match(str(value).strip())
    if isinstance(value, bool) or match is None:
        raise ComposeError(f"{where}: {value!r} is not a memory size (like 512m or 1g)")
    number, unit = match.groups()
    return int(float(number) * 1024 ** " kmg".index(unit.lower() or " "))


def argv(value: object, where: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return [str(v) for v in value]
    raise ComposeError(f"{where}: must be a string or a list of strings")


def environment(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else scalar(v) for k, v in value.items()}
    if isinstance(value, list):
        env = {}
        for item in value:
            key, sep, val = str(item).partition("=")
            if not sep:
                raise ComposeError(f"{where}: {item!r} has no value (gymflow does not pass the host's environment)")
            env[key] = val
        return env
    raise ComposeError(f"{where}: must be a list of KEY=value or a map")


def env_files(value: object, base: Path, where: str) -> dict[str, str]:
    paths = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ComposeError(f"{where}: must be a path or a list of paths")
    env: dict[str, str] = {}
    for rel in paths:
        path = (base / rel).resolve()
        if not path.is_relative_to(base) or not path.is_file():
            raise ComposeError(f"{where}: {rel!r} is not a file in {base}")
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if line and not line.startswith("#"):
                key, _, val = line.removeprefix("export ").partition("=")
                env[key.strip()] = val.strip().strip("'\"")
    return env


def volume_source(entry: object, where: str) -> str | None:
    """The named volume an entry uses (None: an anonymous one); host paths and binds are refused."""
    if isinstance(entry, dict):
        kind, source = entry.get("type", "volume"), entry.get("source")
    else:
        source, sep, _ = str(entry).partition(":")
        kind, source = ("volume", source) if sep else ("volume", None)
    if kind != "volume" or (source and (source.startswith(("/", ".", "~")))):
        raise ComposeError(f"{where}: {entry!r} mounts from the host: not supported by gymflow")
    return str(source) if source else None


def interpolate_tree(value: Any, variables: Mapping[str, str], where: str) -> Any:
    if isinstance(value, str):
        return interpolate(value, variables, where=where)
    if isinstance(value, list):
        return [interpolate_tree(v, variables, where) for v in value]
    if isinstance(value, dict):
        return {k: interpolate_tree(v, variables, where) for k, v in value.items()}
    return value


def scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
