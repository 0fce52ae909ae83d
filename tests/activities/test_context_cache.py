"""The node's cache of fused rollouts' conversations (gymflow.activities.context_cache): a token names one
turn's conversation, a retried turn still finds the start it was given, and the bound holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from gymflow.activities import errors
from gymflow.activities.context_cache import MESSAGE_OVERHEAD_CHARS, ContextCache, Held
from gymflow.activities.env import EnvActivities
from gymflow.activities.model import ModelConfig
from gymflow.activities.turn import CachedContext, PlayTurnInput, TurnActivities, TurnDelta
from gymflow.envs.contract import Message, Task, ToolAttachment, ToolCall, ToolSpec, json_bytes

TOOLS = [ToolSpec(name="step", description="d", input_schema={"type": "object"})]


def held(entry: Held | None) -> tuple[list[Message], list[ToolSpec]] | None:
    return None if entry is None else (entry.messages, entry.tools)


def conversation(n: int, text: str = "x") -> list[Message]:
    return [Message(role="user", content=f"{text}{i}") for i in range(n)]


def test_a_token_gives_back_what_was_put_and_only_up_to_its_length() -> None:
    cache = ContextCache()
    messages = conversation(3)
    token = cache.put("k", messages, TOOLS)
    assert token is not None
    assert held(cache.get("k", token, 3)) == (messages, TOOLS)
    assert held(cache.get("k", token, 2)) == (messages[:2], TOOLS)
    assert cache.get("k", token, 4) is None  # more than it holds
    assert cache.get("k", "another-token", 1) is None
    assert cache.get("other-key", token, 1) is None


def test_the_next_turn_keeps_the_previous_token_for_its_start_only() -> None:
    cache = ContextCache()
    first = cache.put("k", conversation(3), TOOLS)
    assert first is not None
    longer = conversation(3) + conversation(2, "y")
    second = cache.put("k", longer, TOOLS, extends=(first, 3))
    assert second is not None and second != first
    assert held(cache.get("k", first, 3)) == (longer[:3], TOOLS)  # a retry of the turn that was given `first`
    assert cache.get("k", first, 4) is None
    assert held(cache.get("k", second, 5)) == (longer, TOOLS)
    third = cache.put("k", longer, TOOLS, extends=(second, 5))
    assert third is not None and cache.get("k", first, 1) is None  # two turns back: gone


def test_the_bound_evicts_the_least_recently_used_and_refuses_what_never_fits() -> None:
    per = len("x0") + MESSAGE_OVERHEAD_CHARS
    cache = ContextCache(max_chars=2 * per)
    a = cache.put("a", conversation(1), TOOLS)
    b = cache.put("b", conversation(1), TOOLS)
    assert a and b and cache.get("a", a, 1) is not None  # a is now the most recently used
    c = cache.put("c", conversation(1), TOOLS)
    assert c and cache.get("b", b, 1) is None and cache.get("a", a, 1) is not None
    assert cache.chars == 2 * per and len(cache) == 2
    assert cache.put("d", conversation(3), TOOLS) is None  # larger than the whole cache
    cache.forget("a")
    cache.forget("a")  # idempotent
    assert len(cache) == 1 and cache.chars == per
    cache.clear()
    assert len(cache) == 0 and cache.chars == 0
    with pytest.raises(ValueError, match="max_chars"):
        ContextCache(max_chars=-1)


def test_inline_images_and_tool_call_arguments_count_towards_the_bound() -> None:
    image = ToolAttachment(kind="image", mime_type="image/png", size_bytes=3000, data="A" * 4000)
    call = ToolCall(id="c1", name="step", arguments={"i": 1}, raw_arguments='{"i": 1}')
    cache = ContextCache(max_chars=3000)
    assert cache.put("k", [Message(role="tool", content="seen", images=[image])], TOOLS) is None
    assert cache.put("k", [Message(role="assistant", tool_calls=[call])], TOOLS) is not None
    assert cache.chars == len('{"i": 1}') + MESSAGE_OVERHEAD_CHARS


async def test_releasing_a_rollout_state_forgets_what_its_node_held(tmp_path: Path) -> None:
    """The path cancel, terminate (the reaper) and a classic finish all take: `EnvActivities.release`."""
    activities = EnvActivities(node_id="n", node_queue="q@n", workspace_root=tmp_path)
    contexts = activities.contexts
    assert contexts.put("rollout-1#0", conversation(2), TOOLS) and contexts.put("rollout-2#0", conversation(2), TOOLS)
    await activities.release("math", "rollout-1#0")  # nothing else held for it: release is idempotent
    assert "rollout-1#0" not in contexts and "rollout-2#0" in contexts
    await activities.shutdown()
    assert len(contexts) == 0


def test_a_turn_that_extends_the_held_start_counts_the_same_size_as_one_put_whole() -> None:
    per = len("x0") + MESSAGE_OVERHEAD_CHARS
    cache = ContextCache()
    first = cache.put("k", conversation(3), TOOLS)
    assert first is not None and cache.chars == 3 * per
    longer = conversation(3) + conversation(2, "y")
    second = cache.put("k", longer, TOOLS, extends=(first, 3))
    assert second is not None and cache.chars == 5 * per
    # A late attempt of the first turn, with a shorter start: sized from what it holds.
    assert cache.put("k", conversation(2) + conversation(1, "z"), TOOLS, extends=(first, 2)) is not None
    assert cache.chars == 3 * per
    # A token this node never gave (the previous entry gone): the whole conversation is sized.
    cache.forget("k")
    assert cache.put("k", longer, TOOLS, extends=("unknown", 3)) is not None and cache.chars == 5 * per


def test_model_settings_and_task_are_held_with_the_conversation_and_sized_once() -> None:
    model = ModelConfig(base_url="http://model.test/v1")
    task = Task(id="t", prompt="p" * 500, ground_truth="g")
    cache = ContextCache()
    first = cache.put("k", conversation(2), TOOLS, model=model, task=task)
    assert first is not None
    entry = cache.get("k", first, 2)
    assert entry is not None and entry.model == model and entry.task == task
    settings = json_bytes(model) + json_bytes(task)
    assert cache.chars == 2 * (len("x0") + MESSAGE_OVERHEAD_CHARS) + settings
    second = cache.put("k", conversation(3), TOOLS, extends=(first, 2), model=model, task=task)
    assert second is not None and cache.chars == 3 * (len("x0") + MESSAGE_OVERHEAD_CHARS) + settings
    untasked = cache.put("k", conversation(3), TOOLS, extends=(second, 3), model=model)
    assert untasked is not None and cache.chars == 3 * (len("x0") + MESSAGE_OVERHEAD_CHARS) + json_bytes(model)


def test_a_turn_sent_as_a_delta_needs_the_start_it_extends() -> None:
    delta = TurnDelta(messages=[], rollout_id="r", turn=1)
    fields = {"env": "math", "state_key": "r#0", "tool_timeout_s": 1, "max_output_chars": 256}
    with pytest.raises(ValidationError, match="needs `cached`"):
        PlayTurnInput(generate=delta, tool_calls_made=0, max_tool_calls=1, **fields)
    turn = PlayTurnInput(
        generate=delta, cached=CachedContext(token="t", messages=2), tool_calls_made=0, max_tool_calls=1, **fields
    )
    assert isinstance(PlayTurnInput.model_validate_json(turn.model_dump_json()).generate, TurnDelta)


async def test_a_delta_whose_node_holds_no_model_settings_is_sent_again_whole(tmp_path: Path) -> None:
    """An entry a turn from before deltas left (no settings): the delta cannot be completed here."""
    env = EnvActivities(node_id="n", node_queue="q@n", workspace_root=tmp_path)
    token = env.contexts.put("r#0", conversation(2), TOOLS)  # no model, no task
    assert token is not None
    turns = TurnActivities(model=None, env=env)  # type: ignore[arg-type]  # never asked: it fails first
    delta = PlayTurnInput(
        generate=TurnDelta(messages=[], rollout_id="r", turn=1),
        cached=CachedContext(token=token, messages=2),
        env="math",
        state_key="r#0",
        tool_timeout_s=1,
        max_output_chars=256,
        tool_calls_made=0,
        max_tool_calls=1,
    )
    with pytest.raises(ApplicationError) as failed:
        await turns.play_turn(delta)
    assert failed.value.type == errors.CONTEXT_MISSING and failed.value.non_retryable
