"""The baseline policy server's tokeniser: UTF-8 bytes over a ChatML template, so token data is honest.

A policy is not a language model, but a trainer-facing endpoint must still say which tokens it saw
and produced. This tokeniser is exact and invertible: token ids 0-255 are bytes, 256 is
``<|im_start|>`` and 257 is ``<|im_end|>``. The chat template (the Qwen/ChatML layout, tools in the
hermes format of `gymflow.envs.wire.chat`) is:

    <|im_start|>{role}\\n{content}<|im_end|>\\n      for every message, where
        system      content + the hermes ``# Tools`` block when tools are offered
        assistant   its hermes text (``<tool_call>`` blocks included)
        tool        a run of consecutive tool messages is one user message of ``<tool_response>`` blocks
    <|im_start|>assistant\\n                        the generation prompt

and a completion is the reply's hermes text followed by ``<|im_end|>``. Native and hermes requests
are tokenised alike: the model sees one template whatever the wire format. A conversation replayed
through the wire renders the previous completion exactly as it was generated, so each prompt extends
the previous prompt + completion, unless the client changed history (then the token data says so).
"""

from __future__ import annotations

from collections.abc import Sequence

from gymflow.envs.contract import Message, ToolSpec
from gymflow.envs.wire import chat

IM_START = 256
IM_END = 257
SPECIAL = {"<|im_start|>": IM_START, "<|im_end|>": IM_END}


def encode(text: str) -> list[int]:
    """Token ids of `text`: UTF-8 bytes, with the two special markers as single tokens."""
    ids: list[int] = []
    rest = text
    while rest:
        hits = [(rest.find(marker), marker) for marker in SPECIAL if marker in rest]
        if not hits:
            ids.extend(rest.encode("utf-8"))
            break
        at, marker = min(hits)
        ids.extend(rest[:at].encode("utf-8"))
        ids.append(SPECIAL[marker])
        rest = rest[at + len(marker) :]
    return ids


def decode(ids: Sequence[int]) -> str:
    """The text of token ids (inverse of `encode`)."""
    names = {v: k for k, v in SPECIAL.items()}
    out: list[str] = []
    run = bytearray()
    for token in ids:
        if token in names:
            out.append(run.decode("utf-8", errors="replace"))
            run.clear()
            out.append(names[token])
        else:
            run.append(token)
    out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)


def render_prompt(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
    """The template text of a conversation, ending with the generation prompt."""
    wire = chat.render_messages(messages, tools, "hermes")
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in wire)
    return turns + "<|im_start|>assistant\n"


def render_completion(reply: Message) -> str:
    """The template text the model generated for `reply`."""
    return chat.hermes_content(reply) + "<|im_end|>"


def prompt_ids(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> list[int]:
    """Token ids of the prompt of a request."""
    return encode(render_prompt(messages, tools))


def completion_ids(reply: Message) -> list[int]:
    """Token ids of a reply."""
    return encode(render_completion(reply))
