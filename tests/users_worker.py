"""A worker process with the refund desk of users_support registered (`python tests/users_worker.py`,
settings from GYMFLOW_* variables): what the user-turn kill test kills with -9."""

from __future__ import annotations

import asyncio

import users_support  # registers the envs

from gymflow.workers.config import Settings
from gymflow.workers.worker import run_worker

if __name__ == "__main__":
    del users_support
    asyncio.run(run_worker(Settings()))
