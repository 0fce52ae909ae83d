"""Every error type users and operators meet, with what it means, in one module.

Two bases say whose fault an error is:

* `UserError` is the base of every *expected* error: something the user fixes (a bad file, a
  mistyped name, an invalid config, no server at an address, an env that cannot work on this node).
  The CLI prints such an error as one ``gymflow: <message>`` line and exits 2; the message names the
  fix. Anything else is a bug or an infrastructure fault and keeps its traceback.
* `InfraError` is the environment's machinery failing (a server died, a sandbox vanished, a verifier
  could not score): the rollout is recovered or ends flagged infra-failed, never scored 0. A
  `ToolError` is the model's problem instead: it becomes an error observation the model sees.

This module is part of the env contract: plain exception classes only, no temporalio. How these
errors cross Temporal (the `ApplicationError` type names a RetryPolicy can name) is
gymflow.activities.errors. Class names are a wire contract where they appear as such type names, so
they are never renamed.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

# The bases.


class UserError(Exception):
    """An expected error whose message tells the user what to fix (the CLI exits 2 on it)."""


class ToolError(Exception):
    """A tool failed in a way the model should see (bad arguments, a refused path, ...)."""


class InfraError(Exception):
    """The environment itself failed: not the model's fault, never a reward of 0.

    Raise it (or a subclass) from run_tool/compute_reward/init_rollout when the failure is in
    the machinery (a server process died, a connection broke). The rollout is recovered or ends
    flagged infra_failed.
    """


# Environments: the contract, the registry, policies, workspaces.


class RolloutNotFound(InfraError):
    """This process holds no state for the rollout (it was released, or the worker restarted)."""


class DatasetError(UserError, ValueError):
    """A dataset row is invalid; the message names the row (file:line) and the field."""


class EnvUnavailableError(UserError):
    """An env cannot work on this node (`gymflow.envs.contract.BaseEnv.unavailable`); the message names the fix."""


class UnknownEnvError(UserError, KeyError):
    """No env is registered under that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown env"


class EnvFileError(UserError, ValueError):
    """An env file is missing or invalid; the message names the file and the key at fault."""


class UnknownPolicy(UserError, ValueError):
    """The env has no policy of that name; the message lists the ones it has."""


class NoBaselinePolicy(UserError, NotImplementedError):
    """The env names no scripted policy, so without a model endpoint nothing can play it."""


class WorkspaceError(ToolError):
    """A workspace path or copy was refused (escape attempt, too large, missing)."""


# Runtimes: where a rollout's tools run (gymflow.envs.runtime).


class SandboxError(InfraError):
    """The sandbox itself failed (cannot start, vanished, engine error): never the model's fault."""


class BuildError(SandboxError):
    """An image could not be built (a bad Dockerfile, a missing base, a timeout): the task cannot run."""


class EngineError(SandboxError):
    """An engine command failed; the message carries the command and the end of its output."""


class EngineUnavailable(UserError):
    """No container engine on this node."""


# Harbor tasks (gymflow.envs.builtin.harbor).


class TaskError(DatasetError):
    """A task directory is invalid; the message names the file and the field."""


class ComposeError(TaskError):
    """A task's docker-compose file is invalid or asks for something gymflow refuses (host mounts,
    ports, privileges, ...); the message names the file, the service and the key."""


class VerifierFailure(enum.StrEnum):
    """Why a verifier produced no reward."""

    TIMEOUT = "verifier_timeout"
    CRASHED = "verifier_crashed"
    """test.sh exited non-zero and wrote no reward file."""
    NO_REWARD = "no_reward_file"
    BAD_REWARD = "bad_reward"
    """The reward file is not a finite number / not {"reward": number}."""


class RewardError(InfraError):
    """The reward machinery ran and could not score the rollout: it ends infra-failed with termination
    `reward_error` (gymflow.envs.wire.termination), never a 0. Any other `InfraError` from a reward (its
    state is gone) is recovered instead."""


class VerifierError(RewardError):
    """The verifier could not score the rollout: infra-failed (reward_error), never a 0."""

    def __init__(self, reason: VerifierFailure, message: str, *, output: str = "") -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.output = output


# Wire formats: token data and chat requests (gymflow.envs.wire).


class TokenDataError(ValueError):
    """A trajectory's token data cannot give an exact sequence (missing, or not a continuation)."""


class TokenMismatch(TokenDataError):
    """A turn's prompt does not extend the previous prompt + completion."""

    def __init__(
        self, turn: int, position: int, expected: int | None, found: int | None, *, previous: int | None = None
    ) -> None:
        """`previous`: the turn it should extend, when not `turn - 1` (a role's sequence skips the others' turns)."""
        super().__init__(
            f"turn {turn}'s prompt does not extend turn {turn - 1 if previous is None else previous}'s prompt + "
            f"completion: first difference "
            f"at token {position} (expected {expected}, found {found}); the chat template or tokenizer "
            "re-renders history differently from what the model generated"
        )
        self.turn = turn
        self.position = position


class ChatFormatError(ValueError):
    """A wire request is not a chat-completions request this module can read."""


# Rewards and evaluation.


class JudgeParseError(ValueError):
    """The judge's reply cannot be read as scores for the rubric.

    Attributes:
        missing: Criteria the reply gave no score for (empty when the problem is another).
    """

    def __init__(self, message: str, *, missing: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


class StatsError(ValueError):
    """The input cannot be summarised as asked (empty, non-finite, ragged, k > n, ...)."""


class RewardSpecError(UserError, ValueError):
    """A reward to rescore with (`gymflow eval rescore --reward`) cannot be loaded; the message names it."""


class LiveRewardError(RewardSpecError):
    """A reward that reads the rollout's live tools or workspace, which a finished batch no longer has:
    it cannot rescore stored trajectories (gymflow.envs.rescore)."""


class BatchError(UserError, LookupError):
    """A batch named by id cannot be rescored or resumed: unknown, unfinished, of another env, or its
    stored trajectories are gone; the message says which and what to do."""


# Storage and bundles (gymflow.activities).


class StorageError(RuntimeError):
    """A URI that cannot be used, or an object that cannot be read or written."""


class BundleError(ValueError):
    """The env cannot be bundled (its files cannot be found)."""


# Env packages and the OpenEnv-protocol exporter (gymflow.envs.packages, gymflow.workers.sdk.openenv).


class PackageError(UserError, ValueError):
    """An env package is missing, ambiguous, or cannot be installed; the message says what to do."""


class ExporterError(Exception):
    """A request the OpenEnv-protocol exporter refuses (an unknown task, a step without an episode)."""


# Processes: the CLI, the worker, the servers, the SDK (gymflow.workers).


class SettingsError(UserError, ValueError):
    """A GYMFLOW_* variable (or option) that is not a valid setting."""


class ConfigError(UserError, ValueError):
    """The run config cannot be used; the message names the file and every field at fault."""


class WorkerStartError(UserError, RuntimeError):
    """The worker cannot start (its Temporal server is unreachable)."""


class ServerError(UserError, RuntimeError):
    """The embedded server could not be found, started or reached."""


class RunningServer(Protocol):
    """What `ServerRunning` says of the server that holds a data dir (gymflow.workers.servers.temporal's
    `ServerRecord` is one): a protocol, so these plain errors need nothing of the process that raises them."""

    @property
    def port(self) -> int: ...

    def where(self) -> str: ...


class ServerRunning(ServerError):
    """A server already runs on this data dir; the message says where and what to do instead."""

    def __init__(self, data_dir: Path, running: RunningServer | None) -> None:
        self.data_dir, self.running = data_dir, running
        where = f" ({running.where()})" if running else ""
        use = f"use it (--address localhost:{running.port}), " if running else ""
        super().__init__(
            f"a Temporal server already runs on data dir {data_dir}{where}: {use}stop it with "
            f"`gymflow server --stop --data-dir {data_dir}`, or give this one another --data-dir"
        )


class ConnectionConfigError(UserError, ValueError):
    """The connection configuration itself is wrong (an unknown profile, an unreadable file)."""


class ConnectionFailed(UserError, RuntimeError):
    """The cluster could not be reached or refused this client; the message says why and what to fix."""


class MissingSearchAttributes(UserError, RuntimeError):
    """The cluster lacks search attributes gymflow sets; the message says how to add them."""


class MetricsPortError(UserError, OSError):
    """The metrics endpoint cannot listen where it was asked to."""


class TracingUnavailable(UserError, ImportError):
    """Tracing was asked for but the OpenTelemetry SDK or exporter is not installed."""


class CodecKeyError(UserError, ValueError):
    """A key is malformed, or a payload names a key this process does not have."""


class SessionError(RuntimeError):
    """An update was refused or failed (e.g. a step after the episode ended); names the reason."""
