"""Who plays a rollout's next model turn when its env declares roles (`BaseEnv.roles`).

A rollout of roles (a solver and its critic, two players) keeps one conversation; the turn passes
between roles only at final answers, where the env's `env_response` activity names the next speaker
(`BaseEnv.next_role`). Each role plays with its own model (`RolloutInput.roles`, else the rollout's
`model`), is sent the conversation from its own point of view (the `generate` activity renders it,
gymflow.envs.wire.roles), and keeps its own token prefix: its prompts extend its own previous turns,
not the other roles'. A role the rollout names but the env does not declare is the input's error and
fails the workflow (InvalidInput); a next speaker the env did not declare ends the rollout as an env
failure. Workflow code only: deterministic, no I/O.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors
    from gymflow.activities.env_schema import RolloutHandle
    from gymflow.activities.model import ModelConfig
    from gymflow.activities.schema import RolloutInput
    from gymflow.envs.contract import TerminationReason
    from gymflow.envs.wire.tokens import TokenPrefix
    from gymflow.workflows.rollout_env import Stop


class RolePlay:
    """The roles of one rollout: who speaks now, each role's model and token prefix, who played each turn.

    Args:
        declared: The env's roles, the first opening (`RolloutHandle.roles`).
        models: The models the rollout names per role (`RolloutInput.roles`); the others play the default.
    """

    def __init__(self, declared: list[str], models: dict[str, ModelConfig]) -> None:
        self.declared = declared
        self.models = models
        self.speaker = declared[0]
        """The role that plays the next model turn."""
        self.speakers: list[str] = []
        """Per model turn played, in order, its role (`Trajectory.speakers`)."""
        self._prefixes: dict[str, TokenPrefix] = {}

    @classmethod
    def of(cls, input: RolloutInput, handle: RolloutHandle) -> RolePlay | None:
        """The rollout's roles once its env is up; None for an env of one unnamed policy.

        Raises:
            ApplicationError: InvalidInput (non-retryable) when `input.roles` names a role the env does
                not declare: a model meant for it would silently never play.
        """
        unknown = [role for role in input.roles if role not in handle.roles]
        if unknown:
            raise ApplicationError(
                f"roles: env {input.env!r} declares no role {', '.join(map(repr, unknown))} (its roles: "
                f"{', '.join(handle.roles) or 'none, it is played by one policy'})",
                type=errors.INVALID_INPUT,
                non_retryable=True,
            )
        return cls(list(handle.roles), dict(input.roles)) if handle.roles else None

    def model(self, default: ModelConfig) -> ModelConfig:
        """The model of the role that speaks now: its own, or `default` (the rollout's policy)."""
        return self.models.get(self.speaker, default)

    def prefix(self) -> TokenPrefix | None:
        """The speaking role's token sequence so far (its last prompt + completion), when token data is on."""
        return self._prefixes.get(self.speaker)

    def played(self, prefix: TokenPrefix | None) -> None:
        """The speaking role played a turn, whose prompt + completion is now `prefix`."""
        self.speakers.append(self.speaker)
        if prefix is not None:
            self._prefixes[self.speaker] = prefix

    def pass_to(self, role: str | None) -> None:
        """The env named the next speaker (`EnvResponse.next_role`).

        Raises:
            Stop: ENV_ERROR when it named none or an undeclared one (the env's bug, never a guess).
        """
        if role is None or role not in self.declared:
            raise Stop(
                TerminationReason.ENV_ERROR,
                f"the env named {role!r} to speak next, not one of its roles ({', '.join(self.declared)})",
            )
        self.speaker = role
