"""Error types users meet, shared by the CLI, the SDK and the envs.

`UserError` is the base of every *expected* error: something the user fixes (a bad file, a
mistyped name, an invalid config, no server at an address, an env that cannot work on this node).
The CLI prints such an error as one ``gymflow: <message>`` line and exits 2; the message names the
fix. Anything else is a bug or an infrastructure fault and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """An expected error whose message tells the user what to fix (the CLI exits 2 on it)."""


class EnvUnavailableError(UserError):
    """An env cannot work on this node (`gymflow.envs.contract.BaseEnv.unavailable`); the message names the fix."""
