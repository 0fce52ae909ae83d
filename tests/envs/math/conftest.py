"""Fixtures for the math environment tests."""

import asyncio
from collections.abc import AsyncIterator

import pytest
from mcp import Client

from gymflow.envs.builtin.math.servers.calculator import server


@pytest.fixture
async def calculator() -> AsyncIterator[Client]:
    """A client connected to the calculator server in memory.

    pytest-asyncio runs a fixture's setup and teardown in different tasks, while the client's anyio
    task group must be entered and exited in one; a holder task owns the client for the test.
    """
    loop = asyncio.get_running_loop()
    connected: asyncio.Future[Client] = loop.create_future()
    release = asyncio.Event()

    async def hold() -> None:
        try:
            async with Client(server) as client:
                connected.set_result(client)
                await release.wait()
        except BaseException as exc:
            if not connected.done():  # failed to connect: tell the fixture why
                connected.set_exception(exc)
            raise

    holder = asyncio.create_task(hold())
    yield await connected
    release.set()
    await holder
