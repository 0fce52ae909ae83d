"""Built-in policies: programs that play an environment without a model.

A policy maps the conversation so far to the next assistant message. It is pure (no I/O) and
reconstructs everything it needs from the messages, exactly as a model would, so it can sit
behind a real OpenAI-compatible HTTP endpoint (`gymflow policy serve ENV`) and be driven by the
same rollout workflow as vLLM or OpenAI.

An env names its scripted policies in `BaseEnv.policies` (`policies:` in an env file): name ->
`module:Class`, `file.py:Class` or the class itself, anything that makes a `Policy` when called
without arguments. Names are looked up here (`make_policy`, behind `BaseEnv.baseline_policy`),
so every env answers the same way:

* `default` is the env's first policy; `null` (`NullPolicy`, the floor) exists in every env.
* By convention every built-in env's known-good policy also answers to `reference`, so a user
  never has to guess an env-specific name (math's `calculator` is its `reference`).
* An env without policies refuses `default` with `NoBaselinePolicy`, a `UserError` saying to pass
  a model endpoint or to name a scripted policy; an unknown name is `UnknownPolicy`, listing the
  names there are. Both also subclass the `NotImplementedError` / `ValueError` callers caught
  before.

Specs are strings so that listing an env's policies (`gymflow envs`) imports nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from gymflow.envs.errors import NoBaselinePolicy, UnknownPolicy
from gymflow.envs.wire.models import Message, ToolCall, ToolSpec

DEFAULT = "default"
"""The name that means an env's first policy (the CLI's `--policy` default)."""
NULL = "null"
"""The policy every env has: it answers nothing useful and calls no tool."""


class Policy(ABC):
    """A deterministic chat policy."""

    name: str = "policy"

    @abstractmethod
    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        """The next assistant message (content and/or tool calls) for this conversation."""


async def converse(
    policy: Policy,
    messages: list[Message],
    tools: Sequence[ToolSpec],
    run: Callable[[ToolCall], Awaitable[tuple[str, bool]]],
    *,
    max_turns: int,
) -> list[Message]:
    """Let `policy` play from `messages` (extended in place and returned) until it answers without
    tool calls or has had `max_turns` turns; `run(call)` gives each call's (text, is_error)."""
    for _ in range(max_turns):
        reply = policy.respond(messages, tools)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            text, error = await run(call)
            messages.append(Message(role="tool", content=text, tool_call_id=call.id, name=call.name, is_error=error))
    return messages


class NullPolicy(Policy):
    """Answers nothing useful and calls no tool: the floor every env's reward must give 0."""

    name = "null"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        del messages, tools
        return Message(role="assistant", content="I don't know.")


PolicySpec = str | Callable[[], Policy]
"""`module:Class`, `path/to/file.py:Class` (absolute, or relative to the working directory), or a
callable making the policy (a `Policy` subclass, a factory function)."""


class DeclaresPolicies(Protocol):
    """What this module reads of an env class: its name and its `policies` (`BaseEnv` is one). A
    protocol, so the contract builds on policies rather than the other way round."""

    name: ClassVar[str]
    policies: ClassVar[Mapping[str, Any]]


def policy_names(cls: type[DeclaresPolicies]) -> list[str]:
    """The names `--policy` accepts for env `cls`, its declared ones first, then `null`."""
    return [*(name for name in cls.policies if name != NULL), NULL]


def policy_aliases(cls: type[DeclaresPolicies]) -> dict[str, list[str]]:
    """Each distinct policy of `cls` under its names (those sharing one spec are aliases), `null` last."""
    groups: dict[str, list[str]] = {}
    by_spec: dict[int | str, str] = {}
    for name, spec in cls.policies.items():
        key = spec if isinstance(spec, str) else id(spec)
        first = by_spec.setdefault(key, name)
        groups.setdefault(first, []).append(name)
    groups.setdefault(NULL, [NULL])
    return groups


def policy_target(spec: PolicySpec) -> str:
    """Where a policy spec points, for listings (`module:Class`)."""
    if isinstance(spec, str):
        return spec
    return f"{getattr(spec, '__module__', '?')}:{getattr(spec, '__qualname__', repr(spec))}"


def make_policy(cls: type[DeclaresPolicies], name: str = DEFAULT) -> Policy:
    """The policy `name` of env `cls` (what `BaseEnv.baseline_policy` returns).

    Raises:
        NoBaselinePolicy: `name` is `default` and the env declares no policy.
        UnknownPolicy: The env has no policy `name`; the message lists its names.
        ValueError: The spec cannot be loaded or does not make a `Policy`.
    """
    env = cls.name or cls.__name__
    policies: Mapping[str, PolicySpec] = cls.policies
    if name == DEFAULT:
        if not policies:
            raise NoBaselinePolicy(
                f"{env} has no baseline policy to play it without a model: pass a model endpoint "
                "(--model-url URL; for `gymflow eval`, --policy URL), or give the env a scripted one "
                "(`policies: {reference: my_policy.py:MyPolicy}` in an env file, a `policies` class "
                f"attribute) for --policy and `gymflow policy serve {env}`"
            )
        name = next(iter(policies))
    if name == NULL and NULL not in policies:
        return NullPolicy()
    spec = policies.get(name)
    if spec is None:
        names = policy_names(cls)
        choices = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
        raise UnknownPolicy(f"{env} has no baseline policy {name!r}; choose {choices}")
    return _instantiate(spec, field=f"{env} policy {name!r}")


def _instantiate(spec: PolicySpec, *, field: str) -> Policy:
    if isinstance(spec, str):
        from gymflow.envs.plugins import load_callable  # light, but only needed for string specs

        factory: Callable[[], Any] = load_callable(spec, field=field)
    else:
        factory = spec
    if isinstance(factory, type) and not issubclass(factory, Policy):
        raise ValueError(f"{field}: {policy_target(spec)} is not a gymflow.envs.policy.Policy subclass")  # noqa: TRY004
    policy = factory()
    if not isinstance(policy, Policy):
        raise ValueError(  # noqa: TRY004
            f"{field}: {policy_target(spec)} made {type(policy).__name__}, not a gymflow.envs.policy.Policy"
        )
    return policy
