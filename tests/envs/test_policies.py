"""Scripted policies by name: `reference` and `null` in every built-in env, a default, clear errors.

The built-in envs' reference policies are played for real (over HTTP, through the rollout
workflow) in their own env's tests and by `gymflow eval`; here: that each name resolves to the
policy it promises, that an env without one says what to do, and that env files and classes can
name their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gymflow.envs.contract import Message, Reward
from gymflow.envs.errors import EnvFileError, NoBaselinePolicy, UnknownPolicy, UserError
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.policy import NullPolicy, Policy, policy_aliases, policy_names
from gymflow.envs.registry import BUILTIN, env_class

KNOWN_GOOD = {  # the class each built-in env's `reference` (and default) must be
    "math": "CalculatorPolicy",
    "sheets": "ReferencePolicy",
    "search": "RetrievePolicy",
    "crm": "ReferencePolicy",
    "crm-support": "ReferenceAgent",
    "crm-support-llm": "ReferenceAgent",
    "units": "ConvertPolicy",
    "harbor": "OraclePolicy",
    "workspace-judge": None,  # played by a judge model only: no scripted policy, `default` refused
}


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_built_in_env_has_reference_null_and_a_default(name: str) -> None:
    cls = env_class(name)
    if KNOWN_GOOD[name] is None:
        with pytest.raises(NoBaselinePolicy):
            cls.baseline_policy()
        assert isinstance(cls.baseline_policy("null"), NullPolicy)
        return
    reference, default = cls.baseline_policy("reference"), cls.baseline_policy()
    assert isinstance(reference, Policy) and type(reference).__name__ == KNOWN_GOOD[name]
    assert type(default) is type(reference)  # the default is the known-good one
    assert isinstance(cls.baseline_policy("null"), NullPolicy)
    names = policy_names(cls)
    assert "reference" in names and names[-1] == "null"
    for policy in names:  # every listed name makes a policy
        assert isinstance(cls.baseline_policy(policy), Policy)


def test_env_specific_names_stay_and_are_listed_as_aliases() -> None:
    math, search = env_class("math"), env_class("search")
    assert type(math.baseline_policy("calculator")) is type(math.baseline_policy("reference"))
    assert type(search.baseline_policy("retrieve")) is type(search.baseline_policy("reference"))
    assert policy_aliases(math) == {"calculator": ["calculator", "reference"], "softmax": ["softmax"], "null": ["null"]}
    assert policy_aliases(search) == {"retrieve": ["retrieve", "reference"], "null": ["null"]}


def test_an_unknown_name_is_a_user_error_listing_the_names() -> None:
    with pytest.raises(UnknownPolicy) as caught:
        env_class("search").baseline_policy("oracle")
    assert str(caught.value) == "search has no baseline policy 'oracle'; choose retrieve, reference or null"
    assert isinstance(caught.value, UserError) and isinstance(caught.value, ValueError)  # old callers catch it


class Bare(McpEnv):
    name = "bare"
    mcp_servers = {"c": {"command": "true"}}

    async def compute_reward(self, rollout_id: str, completion: list[Message], ground_truth: Any, **kw: Any) -> Reward:
        return Reward(total=0.0)


class Echo(Policy):
    name = "echo"

    def respond(self, messages: Any, tools: Any) -> Message:
        return Message(role="assistant", content=messages[-1].content)


def test_an_env_without_policies_says_to_pass_a_model_or_name_one() -> None:
    with pytest.raises(NoBaselinePolicy) as caught:
        Bare.baseline_policy()
    message = str(caught.value)
    assert message.startswith("bare has no baseline policy to play it without a model")
    assert "--model-url URL" in message and "gymflow policy serve bare" in message and "policies" in message
    assert isinstance(caught.value, UserError) and isinstance(caught.value, NotImplementedError)
    assert isinstance(Bare.baseline_policy("null"), NullPolicy)  # null everywhere, even here
    with pytest.raises(UnknownPolicy, match="bare has no baseline policy 'reference'; choose null"):
        Bare.baseline_policy("reference")


def test_a_class_names_its_policy_by_target_or_by_class() -> None:
    by_class = type("ByClass", (Bare,), {"name": "by-class", "policies": {"echo": Echo}})
    assert isinstance(by_class.baseline_policy(), Echo) and policy_names(by_class) == ["echo", "null"]
    by_target = type(
        "ByTarget", (Bare,), {"policies": {"reference": "gymflow.envs.examples.units_policy:ConvertPolicy"}}
    )
    assert by_target.baseline_policy().name == "convert"
    not_a_policy = type("NotAPolicy", (Bare,), {"policies": {"reference": "gymflow.envs.contract:Task"}})
    with pytest.raises(
        ValueError, match=r"gymflow\.envs\.contract:Task is not a gymflow\.envs\.policy\.Policy subclass"
    ):
        not_a_policy.baseline_policy()
    makes_an_int = type("MakesAnInt", (Bare,), {"policies": {"reference": lambda: 42}})
    with pytest.raises(ValueError, match=r"made int, not a gymflow\.envs\.policy\.Policy"):
        makes_an_int.baseline_policy()


POLICY_FILE = """
from gymflow.envs.contract import Message
from gymflow.envs.policy import Policy

class Spell(Policy):
    name = "spell"

    def respond(self, messages, tools):
        return Message(role="assistant", content="<answer>s-t-r</answer>")

class NotOne:
    pass
"""


def env_file(tmp_path: Path, policies: str) -> Path:
    (tmp_path / "policies").mkdir(exist_ok=True)
    (tmp_path / "policies" / "spell.py").write_text(POLICY_FILE)
    path = tmp_path / "letters.yaml"
    path.write_text(f"mcpServers:\n  c: {{command: 'true'}}\npolicies: {policies}\n")
    return path


def test_an_env_file_names_policies_relative_to_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = env_file(tmp_path, "{reference: policies/spell.py:Spell, quiet: 'gymflow.envs.policy:NullPolicy'}")
    monkeypatch.chdir(tmp_path.parent)  # the spec is relative to the env file, not to here
    cls = env_class(str(path))
    assert cls.baseline_policy().name == "spell" and cls.baseline_policy("quiet").name == "null"
    assert policy_names(cls) == ["reference", "quiet", "null"]


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        ("{reference: policies/nope.py:Spell}", "policies.reference: cannot load"),
        ("{reference: policies/spell.py:Nope}", "policies.reference: "),
        (
            "{reference: policies/spell.py:NotOne}",
            "policies.reference: policies/spell.py:NotOne is not a gymflow.envs.policy.Policy",
        ),
        ("{'null': policies/spell.py:Spell}", "policies: Value error, 'null' is built in"),
        ("{default: policies/spell.py:Spell}", "'default' is built in"),
        ("{'two words': policies/spell.py:Spell}", "must be a word"),
    ],
)
def test_a_bad_policy_in_an_env_file_is_an_error_naming_the_key(tmp_path: Path, policies: str, message: str) -> None:
    with pytest.raises(EnvFileError, match=message.replace(".", r"\.").replace("(", r"\(")):
        env_class(str(env_file(tmp_path, policies)))
