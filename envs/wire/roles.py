"""What each role of a rollout sees: the shared conversation from one role's point of view.

A rollout of several roles (`BaseEnv.roles`: a solver and its critic, two players) keeps one
conversation, each assistant message tagged with the role that wrote it (`Message.speaker`). Each
role's model is a chat model that expects to be the assistant, so it reads that conversation as a
person in the room would: its own turns as `assistant` (with the results of its own tool calls),
every other role's final answer as a `user` message (the critic is handed the solver's answer to
judge), and neither the other roles' tool calls nor their results, which are their own business.
System and user messages are everyone's.

Because a role's own turns are rendered exactly as they were generated and everything else arrives
as new messages after them, each role's prompt extends its previous prompt + completion, and its
turns make one linear token sequence of their own (gymflow.envs.wire.tokens.build_role_sequences).
Pure: no I/O, no temporalio.
"""

from __future__ import annotations

from collections.abc import Sequence

from gymflow.envs.wire.models import Message


def role_view(messages: Sequence[Message], role: str) -> list[Message]:
    """The conversation as role `role`'s model is given it (see the module docstring).

    Args:
        messages: The rollout's conversation, system prompt first.
        role: The role about to speak.

    Returns:
        The messages that role sees, its own assistant turns untouched (so its prompt extends what it
        generated before) and the other roles' final answers as user messages, without their speaker.
    """
    view: list[Message] = []
    hidden: set[str] = set()  # the ids of the other roles' tool calls: their results are hidden too
    for message in messages:
        if message.role == "assistant" and message.speaker is not None and message.speaker != role:
            if message.tool_calls:
                hidden.update(call.id for call in message.tool_calls)
            elif message.content:
                view.append(Message(role="user", content=message.content))
        elif not (message.role == "tool" and message.tool_call_id in hidden):
            view.append(message)
    return view
