"""What a command or script run on one machine needs: a client, and a policy endpoint.

`connect_or_start` dials the configured cluster and, on a local dev address with nothing there,
starts the embedded Temporal server; `endpoint` serves an env's named baseline policy over real
HTTP when no model URL is given. `gymflow eval`, `gymflow rollout`, `gymflow demo` and the SDK's
`run_eval` / `run_generate` share them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TextIO

from temporalio.client import Client

from gymflow.envs.errors import ServerError, ServerRunning
from gymflow.envs.registry import env_class
from gymflow.workers.client import connect, data_converter
from gymflow.workers.config import Settings
from gymflow.workers.servers import temporal as embedded
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.tracing import client_interceptors


def is_url(policy: str) -> bool:
    """Whether a policy value is an endpoint (…/v1) rather than the name of a baseline policy."""
    return policy.startswith(("http://", "https://"))


@contextlib.asynccontextmanager
async def endpoint(env: str, policy: str) -> AsyncIterator[str]:
    """The chat endpoint of `policy`: itself if it is a URL, else the env's named baseline served locally."""
    if is_url(policy):
        yield policy
        return
    async with PolicyServer(env_class(env).baseline_policy(policy), host="127.0.0.1", port=0) as server:
        yield server.url


async def connect_or_start(settings: Settings, *, start_server: bool, out: TextIO) -> Client:
    """A client of the configured cluster (gymflow.workers.connection: flags, GYMFLOW_*, TEMPORAL_* and
    profiles); with `start_server`, start the embedded server if none answers at a local dev address.

    A local dev server gets gymflow's search attributes registered; any other cluster only has them
    checked (and the command refused, saying how to add them, when one is missing).
    """
    connection = settings.temporal_connection()
    converter = data_converter(settings)  # encryption / external storage, as configured
    interceptors = client_interceptors(settings)  # tracing, when configured

    async def dial() -> Client:
        return await connect(
            connection=connection, data_converter=converter, interceptors=interceptors, check_search_attributes=False
        )

    if not connection.local_dev:  # a cluster: one dial, and its own error (TLS, credentials) at once
        client = await dial()
        await embedded.check_search_attributes(client, connection)
        return client
    try:
        client = await embedded.wait_until_reachable(dial, timeout_s=1.0)
    except ServerError as exc:
        if not start_server:
            raise ServerError(str(exc.__cause__ or exc)) from None
        try:
            pid = embedded.start_background(
                data_dir=settings.data_dir, port=connection.port, ui_port=settings.web_ui_port
            )
            print(f"started the embedded Temporal server (pid {pid}, data in {settings.data_dir})", file=out)
        except ServerRunning as running:
            # The data dir's server serves another port (say so), or this one and is still starting
            # (another command started it a moment ago): then wait for it.
            if running.running is None or running.running.port != connection.port:
                raise
        client = await embedded.wait_until_reachable(dial, timeout_s=60.0)
    await embedded.register_search_attributes(client)
    return client
