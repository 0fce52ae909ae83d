"""A worker process with the test envs of batch_support registered (`python tests/batch_worker.py`, settings
from GYMFLOW_* variables): what the resume test kills with -9 in the middle of a batch."""

from __future__ import annotations

import asyncio

import batch_support  # registers the envs

from gymflow.workers.config import Settings
from gymflow.workers.worker import run_worker

if __name__ == "__main__":
    del batch_support
    asyncio.run(run_worker(Settings()))
