"""Token-level trajectories: what the model saw and produced, token by token, as a trainer needs it.

Re-tokenising a conversation after the fact silently corrupts RL training (chat templates are not
invertible: the same text tokenises differently, and the text a template renders for history may
differ from what the model generated). So when the endpoint can return them, the model activity
records per assistant turn the prompt token ids, the completion token ids and their logprobs, and
`build_sequence` concatenates the turns into one sequence with a loss mask (1 on tokens the model
generated, 0 on prompt, tool and template tokens) that is exactly what the model saw, turn after
turn.

Decisions worth knowing:

* History stays linear. A turn's prompt normally is the previous prompt + completion + the new
  messages. The model activity is given the previous sequence's length and SHA-256 digest
  (`TokenPrefix`), checks the new prompt against it, and records only the tokens after it
  (`TurnTokens.extends=True`). A prompt that does not extend the previous sequence (a chat template
  that drops reasoning from history, a tokenizer that merges across the boundary) is recorded whole
  with ``extends=False``, and `build_sequence` raises `TokenMismatch` naming the turn and the first
  differing token: never a silent glue.
* A program that rewrites its own history between calls (a harness agent that compacts or drops
  old turns, gymflow.workflows.harness) breaks that line by design. `build_segments` then splits the
  turns into segments, each one linear sequence with its own loss mask: a turn joins the segment
  whose prompt + completion its prompt extends, else it starts a new segment with its whole prompt.
  Trainers take every segment as a sample of the same rollout; nothing is re-tokenised.
* Several roles in one rollout (`BaseEnv.roles`: a solver and its critic) each see the conversation
  their own way, so each role's turns are one linear sequence of their own: `build_role_sequences`
  gives one per role, its mask 1 only on that role's tokens (`build_sequence` refuses such turns).
* Compact wire form: token ids and logprobs travel as base64 of little-endian int32 / float32 arrays
  (`PackedInts`, `PackedFloats`): ~5.3 bytes per token instead of ~7 (ids) or ~20 (logprobs) as JSON
  numbers. In Python they are plain lists; logprobs are stored at float32 precision.
* Parsing the endpoint's answer (`completion_token_data`) accepts vLLM's shape (``return_token_ids``:
  top-level ``prompt_token_ids``, ``choices[0].token_ids``; with ``return_tokens_as_token_ids`` the
  logprob entries read ``token_id:N``) and SGLang's (``choices[0].prompt_token_ids`` and
  ``choices[0].token_ids``); logprobs come from ``choices[0].logprobs.content[i].logprob``.

Pure (no I/O, no temporalio): passed through the workflow sandbox.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator

from gymflow.envs.errors import TokenDataError, TokenMismatch

_INT32 = (-(2**31), 2**31 - 1)


def pack_ints(values: Sequence[int]) -> str:
    """Base64 of `values` as little-endian int32."""
    return base64.b64encode(struct.pack(f"<{len(values)}i", *values)).decode("ascii")


def unpack_ints(text: str) -> list[int]:
    """The int32 list `pack_ints` encoded."""
    raw = _b64(text)
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


def pack_floats(values: Sequence[float]) -> str:
    """Base64 of `values` as little-endian float32."""
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


def unpack_floats(text: str) -> list[float]:
    """The float32 list `pack_floats` encoded."""
    raw = _b64(text)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def _b64(text: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64: {exc}") from None
    if len(raw) % 4:
        raise ValueError(f"{len(raw)} bytes is not a whole number of 4-byte values")
    return raw


def _ints(value: Any) -> list[int]:
    if isinstance(value, str):
        return unpack_ints(value)
    if not isinstance(value, list | tuple):
        raise ValueError("token ids must be a list of int32 or base64 of little-endian int32")  # noqa: TRY004
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not _INT32[0] <= item <= _INT32[1]:
            raise ValueError(f"token id {item!r} is not an int32")
    return list(value)


def _floats(value: Any) -> list[float]:
    if isinstance(value, str):
        return unpack_floats(value)
    if not isinstance(value, list | tuple):
        raise ValueError("logprobs must be a list of numbers or base64 of little-endian float32")  # noqa: TRY004
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | float) or math.isnan(item):
            raise ValueError(f"logprob {item!r} is not a number")
        out.append(float(item))
    return out


PackedInts = Annotated[list[int], PlainValidator(_ints), PlainSerializer(pack_ints, return_type=str, when_used="json")]
"""A list of int32 in Python; base64 little-endian int32 on the wire (JSON)."""
PackedFloats = Annotated[
    list[float], PlainValidator(_floats), PlainSerializer(pack_floats, return_type=str, when_used="json")
]
"""A list of floats in Python; base64 little-endian float32 on the wire (JSON)."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenPrefix(_Wire):
    """The token sequence so far (previous prompt + completion), by length and digest."""

    length: int
    sha256: str


def digest(ids: Sequence[int]) -> str:
    """SHA-256 (hex) of `ids` as little-endian int32."""
    return hashlib.sha256(struct.pack(f"<{len(ids)}i", *ids)).hexdigest()


class TurnTokens(_Wire):
    """One assistant turn's tokens, as the endpoint reported them."""

    turn: int
    """The assistant turn (0-based) these tokens belong to."""
    prompt_ids: PackedInts
    """The prompt's tokens after the previous prompt + completion when `extends`; else the whole prompt."""
    extends: bool | None = None
    """None on the first turn; True when the prompt was checked to start with the previous turn's
    prompt + completion (so only the rest is in `prompt_ids`); False when it does not."""
    prompt_length: int
    """Tokens in the whole prompt of this turn."""
    completion_ids: PackedInts
    """The tokens the model generated (including a stop token the endpoint reports)."""
    logprobs: PackedFloats | None = None
    """Log-probability of each completion token under the sampling policy; None when not returned."""
    speaker: str | None = Field(default=None, exclude_if=lambda speaker: speaker is None)
    """The rollout role whose model played this turn (`BaseEnv.roles`); None without roles. Its prompt
    then extends that role's previous turn, not the previous turn of the rollout."""


class TokenSequence(_Wire):
    """A whole conversation as one token sequence, for a trainer."""

    ids: PackedInts
    loss_mask: PackedInts
    """1 on tokens the model generated, 0 on prompt, tool and template tokens."""
    logprobs: PackedFloats | None = None
    """Per token: the completion logprob at model tokens, 0.0 elsewhere; None if any turn lacked them."""


def build_sequence(turns: Sequence[TurnTokens], *, expected_turns: int | None = None) -> TokenSequence:
    """Concatenate per-turn tokens into one sequence with a loss mask.

    Args:
        turns: The trajectory's token data, one entry per assistant turn, in order.
        expected_turns: The number of assistant turns; a turn without token data is an error.

    Raises:
        TokenDataError: A turn has no token data, or the turns were played by several roles (each
            role saw its own conversation: `build_role_sequences`).
        TokenMismatch: A turn's prompt does not extend the previous prompt + completion.
    """
    _one_speaker(turns)
    numbers = [t.turn for t in turns]
    wanted = list(range(expected_turns if expected_turns is not None else len(turns)))
    if numbers != wanted:
        missing = sorted(set(wanted) - set(numbers))
        raise TokenDataError(
            f"token data covers turns {numbers}, not {wanted}"
            + (
                f": turn(s) {missing} have none (the endpoint returned no token ids, or they were off)"
                if missing
                else ""
            )
        )
    return _linear(turns)


def build_role_sequences(
    turns: Sequence[TurnTokens], *, speakers: Sequence[str], roles: Sequence[str] | None = None
) -> dict[str, TokenSequence]:
    """One token sequence and loss mask per role of a rollout whose turns several roles played.

    Each role's model saw the conversation from its own point of view (gymflow.envs.wire.roles), so
    each role's turns form a linear sequence of their own: a role's prompt extends its own previous
    prompt + completion. A role's mask is 1 only on the tokens its model generated; the other roles'
    words reach it as prompt tokens (0), like tool results.

    Args:
        turns: The trajectory's token data, in turn order (`Trajectory.tokens`).
        speakers: Per model turn, in order, the role that played it (`Trajectory.speakers`).
        roles: The roles wanted (default: every role that played); the others' turns may lack token data.

    Raises:
        TokenDataError: A wanted role's turn has no token data, a turn's record names another role
            than `speakers`, or a wanted role played no turn.
        TokenMismatch: A role's turn does not extend that role's previous prompt + completion.
    """
    recorded = {t.turn: t for t in turns}
    for turn in turns:
        played = speakers[turn.turn] if 0 <= turn.turn < len(speakers) else None
        if turn.speaker != played:
            raise TokenDataError(f"turn {turn.turn}'s token data names role {turn.speaker!r}, its turn {played!r}")
    sequences: dict[str, TokenSequence] = {}
    for role in roles if roles is not None else dict.fromkeys(speakers):
        numbers = [i for i, speaker in enumerate(speakers) if speaker == role]
        if not numbers:
            raise TokenDataError(f"role {role!r} played no turn (the roles that did: {sorted(set(speakers))})")
        missing = [i for i in numbers if i not in recorded]
        if missing:
            raise TokenDataError(
                f"role {role!r}'s turn(s) {missing} have no token data (the endpoint returned no token ids, "
                "or they were off for this role)"
            )
        sequences[role] = _linear([recorded[i] for i in numbers])
    return sequences


def _one_speaker(turns: Sequence[TurnTokens]) -> None:
    roles = sorted({t.speaker for t in turns if t.speaker is not None})
    if len(roles) > 1:
        raise TokenDataError(
            f"the turns were played by roles {roles}, each seeing its own conversation: take one sequence "
            "per role (Trajectory.role_sequences, gymflow.envs.wire.tokens.build_role_sequences)"
        )


def _linear(turns: Sequence[TurnTokens]) -> TokenSequence:
    """`turns` (one policy's, in order) as one sequence: each prompt must extend the one before it."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] | None = []
    for index, turn in enumerate(turns):
        if index and turn.extends is not True:
            prompt = turn.prompt_ids
            position = next((i for i, (a, b) in enumerate(zip(ids, prompt, strict=False)) if a != b), len(prompt))
            if position >= len(prompt) and len(prompt) >= len(ids):
                position = len(ids)  # the prompt does extend: it was recorded whole anyway
                ids.extend(prompt[position:])
                mask.extend([0] * (len(prompt) - position))
            else:
                expected = ids[position] if position < len(ids) else None
                found = prompt[position] if position < len(prompt) else None
                raise TokenMismatch(turn.turn, position, expected, found, previous=turns[index - 1].turn)
        else:
            ids.extend(turn.prompt_ids)
            mask.extend([0] * len(turn.prompt_ids))
        if len(ids) != turn.prompt_length:
            raise TokenDataError(
                f"turn {turn.turn}: the prompt has {turn.prompt_length} tokens, the sequence {len(ids)}"
            )
        if logprobs is not None:
            logprobs.extend([0.0] * (len(ids) - len(logprobs)))
        ids.extend(turn.completion_ids)
        mask.extend([1] * len(turn.completion_ids))
        if logprobs is not None and turn.logprobs is not None and len(turn.logprobs) == len(turn.completion_ids):
            logprobs.extend(turn.logprobs)
        else:
            logprobs = None
    return TokenSequence(ids=ids, loss_mask=mask, logprobs=logprobs)


def build_segments(turns: Sequence[TurnTokens], *, expected_turns: int | None = None) -> list[TokenSequence]:
    """Split per-turn tokens into linear segments, each with its own loss mask.

    A turn continues the segment whose whole sequence (prompt + completion so far) its prompt
    starts with: the previous turn's segment when it was recorded as extending it
    (`TurnTokens.extends`), else the first segment whose sequence is a prefix of its whole prompt.
    A turn that extends no segment starts one. Turns that all extend each other give one segment,
    equal to `build_sequence`'s sequence.

    Raises:
        TokenDataError: A turn has no token data, or its lengths contradict the record, or the turns
            were played by several roles (`build_role_sequences`).
    """
    _one_speaker(turns)
    numbers = [t.turn for t in turns]
    wanted = list(range(expected_turns if expected_turns is not None else len(turns)))
    if numbers != wanted:
        raise TokenDataError(f"token data covers turns {numbers}, not {wanted}")
    segments: list[tuple[list[int], list[int], list[float] | None]] = []
    last: int | None = None
    for turn in turns:
        if turn.extends is True and last is not None:
            index = last
            ids, mask, logprobs = segments[index]
            ids.extend(turn.prompt_ids)
            mask.extend([0] * len(turn.prompt_ids))
        else:
            prompt = turn.prompt_ids
            index = next(
                (i for i, (ids, _, _) in enumerate(segments) if len(ids) <= len(prompt) and prompt[: len(ids)] == ids),
                len(segments),
            )
            if index == len(segments):
                segments.append(([], [], []))
            ids, mask, logprobs = segments[index]
            mask.extend([0] * (len(prompt) - len(ids)))
            ids.extend(prompt[len(ids) :])
        if len(ids) != turn.prompt_length:
            raise TokenDataError(
                f"turn {turn.turn}: the prompt has {turn.prompt_length} tokens, its segment {len(ids)}"
            )
        if logprobs is not None:
            logprobs.extend([0.0] * (len(ids) - len(logprobs)))
        ids.extend(turn.completion_ids)
        mask.extend([1] * len(turn.completion_ids))
        if logprobs is not None and turn.logprobs is not None and len(turn.logprobs) == len(turn.completion_ids):
            logprobs.extend(turn.logprobs)
        else:
            segments[index] = (ids, mask, None)
        last = index
    return [TokenSequence(ids=ids, loss_mask=mask, logprobs=logprobs) for ids, mask, logprobs in segments]


def turn_tokens(
    *,
    turn: int,
    prompt_ids: list[int],
    completion_ids: list[int],
    logprobs: list[float] | None,
    prefix: TokenPrefix | None,
    speaker: str | None = None,
) -> tuple[TurnTokens, TokenPrefix]:
    """A turn's record (only the new prompt tokens when it extends `prefix`) and the next prefix;
    `speaker`: the role that played it (its `prefix` is then that role's own)."""
    extends: bool | None = None
    new = prompt_ids
    if prefix is not None:
        extends = len(prompt_ids) >= prefix.length and digest(prompt_ids[: prefix.length]) == prefix.sha256
        if extends:
            new = prompt_ids[prefix.length :]
    whole = prompt_ids + completion_ids
    record = TurnTokens(
        turn=turn,
        prompt_ids=new,
        extends=extends,
        prompt_length=len(prompt_ids),
        completion_ids=completion_ids,
        logprobs=logprobs,
        speaker=speaker,
    )
    return record, TokenPrefix(length=len(whole), sha256=digest(whole))


# -- the endpoint's answer ----------------------------------------------------------------------


def completion_token_data(
    completion: Mapping[str, Any],
) -> tuple[list[int] | None, list[int] | None, list[float] | None]:
    """(prompt ids, completion ids, completion logprobs) of a chat completion; None where absent.

    Malformed token data counts as absent: it is never half-trusted.
    """
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else {}
    prompt = _id_list(completion.get("prompt_token_ids"))
    if prompt is None:  # SGLang puts it on the choice
        prompt = _id_list(choice.get("prompt_token_ids"))
    ids = _id_list(choice.get("token_ids"))
    logprobs: list[float] | None = None
    content = choice.get("logprobs")
    entries = content.get("content") if isinstance(content, Mapping) else None
    if isinstance(entries, list) and all(isinstance(e, Mapping) for e in entries):
        values = [e.get("logprob") for e in entries]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            logprobs = [max(float(v), -1e30) for v in values]
        if ids is None:  # older vLLM: `return_tokens_as_token_ids` writes "token_id:N"
            ids = _ids_from_logprob_tokens(entries)
    if ids is not None and logprobs is not None and len(logprobs) != len(ids):
        logprobs = None
    return prompt, ids, logprobs


def _id_list(value: Any) -> list[int] | None:
    if not isinstance(value, list):
        return None
    try:
        return _ints(value)
    except ValueError:
        return None


def _ids_from_logprob_tokens(entries: list[Mapping[str, Any]]) -> list[int] | None:
    ids = []
    for entry in entries:
        token = entry.get("token")
        if not isinstance(token, str) or not token.startswith("token_id:"):
            return None
        try:
            ids.append(int(token.removeprefix("token_id:")))
        except ValueError:
            return None
    return _id_list(ids)
