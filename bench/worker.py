"""A benchmark worker process: `python -m bench.worker --mode gymflow|bare --address A --task-queue Q`.

`gymflow` runs the real worker (`gymflow.workers.worker.running_worker`, settings from GYMFLOW_*
variables as `gymflow worker` reads them) with the benchmark env registered; `bare` runs
`BareRolloutWorkflow` with the same worker options, in the SDK's stock sandbox runner (gymflow's own
runner with GYMFLOW_BENCH_BARE_RUNNER=gymflow). It prints ``ready`` once polling and stops on
SIGTERM/SIGINT. `--processes N` runs N of them under the `gymflow worker --processes` supervisor
(gymflow.workers.processes), each printing its own ``ready``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from bench.bare import BareActivities, BareRolloutWorkflow
from bench.direct import DirectRunner
from bench.workload import BenchEnv  # importing it registers the benchmark env
from gymflow.activities.names import node_queue
from gymflow.workers.client import connect
from gymflow.workers.config import Settings

BARE_RUNNER_VAR = "GYMFLOW_BENCH_BARE_RUNNER"
"""``stock`` (default): the bare workflow runs in the SDK's `SandboxedWorkflowRunner`; ``gymflow``: in
gymflow's (gymflow.workers.sandbox_runner), to measure what that runner alone gives."""


@contextlib.asynccontextmanager
async def bare_worker(client: Client, settings: Settings) -> AsyncIterator[None]:
    from gymflow.workers.sandbox_runner import workflow_runner
    from gymflow.workers.worker import worker_tuning

    queue = node_queue(settings.task_queue, settings.node_id)
    # Bare Temporal runs its workflows in the SDK's own sandbox runner (gymflow's passthrough list,
    # so its imports cost the same); GYMFLOW_BENCH_BARE_RUNNER=gymflow gives it gymflow's runner.
    stock = os.environ.get(BARE_RUNNER_VAR, "stock") != "gymflow"
    runner = workflow_runner("stock" if stock else "fast")
    acts = BareActivities(queue, work=DirectRunner(BenchEnv(workspace_root=settings.workspace_root / "bare")))
    shared = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[BareRolloutWorkflow],
        activities=[acts.init, acts.generate],
        **(worker_tuning(settings, workflows=True) | {"workflow_runner": runner}),
    )
    node = Worker(
        client,
        task_queue=queue,
        activities=[acts.call_tool, acts.turn, acts.reward, acts.release],
        **worker_tuning(settings, workflows=False),
    )
    try:
        async with shared, node:
            yield
    finally:
        assert acts.work is not None
        await acts.work.aclose()


async def serve(mode: str, address: str, task_queue: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="gymflow-bench-worker-"))
    settings = Settings(
        temporal_address=address, task_queue=task_queue, workspace_root=root / "ws", data_dir=root / "data"
    )
    client = await connect(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if mode == "bare":
        context: contextlib.AbstractAsyncContextManager[object] = bare_worker(client, settings)
    else:
        from gymflow.workers.worker import running_worker

        context = running_worker(client, settings)
    async with context:
        print("ready", flush=True)
        await stop.wait()


async def supervise(processes: int, mode: str, address: str, task_queue: str) -> int:
    """`gymflow worker --processes N` with benchmark workers as its children (each prints ``ready``)."""
    from gymflow.workers.processes import Supervisor

    root = Path(tempfile.mkdtemp(prefix="gymflow-bench-supervisor-"))
    settings = Settings(
        temporal_address=address, task_queue=task_queue, workspace_root=root / "ws", data_dir=root / "data"
    )
    command = [sys.executable, "-m", "bench.worker", "--mode", mode, "--address", address, "--task-queue", task_queue]
    return await Supervisor(settings, processes, command=command).run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["gymflow", "bare"], required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--processes", type=int, default=1, help="worker processes (gymflow.workers.processes)")
    args = parser.parse_args()
    if args.processes > 1:
        sys.exit(asyncio.run(supervise(args.processes, args.mode, args.address, args.task_queue)))
    asyncio.run(serve(args.mode, args.address, args.task_queue))
    sys.exit(0)


if __name__ == "__main__":
    main()
