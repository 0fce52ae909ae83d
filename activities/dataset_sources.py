"""Reading the sources of dataset generation: a corpus directory or S3 prefix, a trace file.

Files over the size limit are reported with their size and never read (a 50 MB file costs a
`stat` or the S3 listing, not 50 MB of memory). Listing order is sorted by id, so a corpus gives
the same documents in the same order on every worker. Blocking file and boto3 calls run in a
thread; boto3 makes one attempt per call (`gymflow.activities.storage.s3_client`), Temporal retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from gymflow.activities.storage import parse_s3_uri, s3_client
from gymflow.envs.errors import StorageError


@dataclass(frozen=True)
class SourceFile:
    """One file of a corpus: its id (relative path), size, and bytes unless it is too large."""

    id: str
    size: int
    data: bytes | None


def _local_root(location: str) -> Path:
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme:
        raise StorageError(f"unsupported source {location!r}: use a directory, file:///dir or s3://bucket/prefix")
    return Path(location)


async def corpus_files(location: str, *, max_bytes: int, s3_endpoint_url: str | None) -> AsyncIterator[SourceFile]:
    """Every file of a corpus, sorted by id (hidden files and directories skipped)."""
    if location.startswith("s3://"):
        async for item in _s3_files(location, max_bytes=max_bytes, s3_endpoint_url=s3_endpoint_url):
            yield item
        return
    root = _local_root(location)
    if not root.is_dir():
        raise StorageError(f"corpus directory {str(root)!r} does not exist")
    paths = await asyncio.to_thread(
        lambda: sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )
    )
    for path in paths:
        size = path.stat().st_size
        data = await asyncio.to_thread(path.read_bytes) if size <= max_bytes else None
        yield SourceFile(path.relative_to(root).as_posix(), size, data)


async def _s3_files(location: str, *, max_bytes: int, s3_endpoint_url: str | None) -> AsyncIterator[SourceFile]:
    bucket, prefix = parse_s3_uri(location)
    client = s3_client(endpoint_url=s3_endpoint_url)
    base = f"{prefix}/" if prefix else ""

    def listing() -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
            out += [(o["Key"], int(o["Size"])) for o in page.get("Contents", []) if not o["Key"].endswith("/")]
        return sorted(out)

    for key, size in await asyncio.to_thread(listing):
        doc_id = key[len(base) :]
        if any(part.startswith(".") for part in doc_id.split("/")):
            continue
        data = await asyncio.to_thread(_s3_read, client, bucket, key) if size <= max_bytes else None
        yield SourceFile(doc_id, size, data)


def _s3_read(client: Any, bucket: str, key: str) -> bytes:
    return bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())


async def read_file(location: str, *, s3_endpoint_url: str | None) -> bytes:
    """The bytes of one file: a path, file:// or s3:// URI."""
    if location.startswith("s3://"):
        bucket, key = parse_s3_uri(location)
        client = s3_client(endpoint_url=s3_endpoint_url)
        try:
            return await asyncio.to_thread(lambda: bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read()))
        except client.exceptions.NoSuchKey as exc:
            raise StorageError(f"no object at {location}") from exc
    path = _local_root(location)
    if not path.is_file():
        raise StorageError(f"trace file {str(path)!r} does not exist")
    return await asyncio.to_thread(path.read_bytes)
