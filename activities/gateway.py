"""The model boundary of harness rollouts: one model call an agent program made, as a durable turn.

An agent program's request reaches its rollout as an Update (`GatewayCall`, sent by the node's
model gateway, gymflow.workers.servers.gateway); the update handler (gymflow.workflows.harness)
answers it from the rollout's record or runs the `model_call` activity below, whose result is the
update's answer (`GatewayAnswer`).

The activity sends the program's chat request to the rollout's upstream (`ModelConfig`), rewritten
by `upstream_body`:

* the model is the rollout's (``ModelConfig.model``, else the worker's default, else none: vLLM
  and SGLang serve their only model), never the name the program asked for;
* ``temperature``, ``top_p``, ``seed`` and ``stop`` set in the config win over the program's;
  ``max_tokens`` is a cap: the smaller of the program's and the config's;
* with ``tokens`` on, the token-capture fields are added (as `generate` adds them) and the answer's
  token ids and logprobs go into `TurnTokens`, taken out of the completion the program sees;
* ``extra_body`` is merged last.

The HTTP client, key, retries (none: Temporal's RetryPolicy) and error mapping are the `generate`
activity's (`ModelActivities.complete`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from temporalio import activity

from gymflow.activities.errors import MODEL_ERROR, non_retryable
from gymflow.activities.model import REPLY_SLACK_BYTES, ModelActivities, ModelConfig, completion_usage
from gymflow.envs.contract import Usage, Wire, json_bytes
from gymflow.envs.wire.tokens import TokenPrefix, TurnTokens, completion_token_data, turn_tokens

MODEL_CALL_UPDATE = "model_call"
"""Update name: one model call of a harness rollout's program (the gateway sends it)."""
Api = Literal["chat", "responses", "messages"]
_TOKEN_FIELDS = ("prompt_token_ids", "token_ids")


class GatewayCall(Wire):
    """One request an agent program sent the gateway, as the update's input."""

    compact_json = True

    request: dict[str, Any]
    """The chat-completions request it means (Responses and Messages requests converted), transport
    fields (``stream``) dropped: what the record is matched on and what goes upstream."""
    api: Api = "chat"
    """Which API the program spoke (the Web UI's summary names it)."""
    start: int = 0
    """The program start it came from (`RunProgramInput.start`): calls of a program a recovery
    replaced are refused."""


class GatewayAnswer(Wire):
    """The update's result: the chat completion to render in the program's API."""

    compact_json = True

    completion: dict[str, Any]
    """The upstream's chat completion, its token ids taken out."""
    turn: int
    """The model turn (0-based) of the rollout this answer is."""
    replayed: bool = False
    """Answered from the rollout's record (a restarted program asking again), not by the model."""


class ModelCallInput(Wire):
    """Input of the `model_call` activity."""

    compact_json = True

    model: ModelConfig
    request: dict[str, Any]
    """The program's chat request (`GatewayCall.request`)."""
    rollout_id: str
    turn: int
    token_prefix: TokenPrefix | None = None
    """The previous turn's prompt + completion (gymflow.envs.wire.tokens), when token data is on."""


class ModelCallResult(Wire):
    """Output of the `model_call` activity: one recorded model turn."""

    compact_json = True

    completion: dict[str, Any]
    """As the server answered, without token ids (they are in `tokens`)."""
    usage: Usage = Field(default_factory=Usage)
    tokens: TurnTokens | None = None
    token_prefix: TokenPrefix | None = None


def upstream_body(config: ModelConfig, request: dict[str, Any], *, default_model: str = "") -> dict[str, Any]:
    """The request sent upstream for a program's `request` (module docstring)."""
    body = dict(request)
    body.pop("model", None)
    model = config.model or default_model
    if model:
        body["model"] = model
    for key in ("temperature", "top_p", "seed", "stop"):
        value = getattr(config, key)
        if value is not None:
            body[key] = value
    asked = body.pop("max_completion_tokens", None) or body.get("max_tokens")
    caps = [v for v in (asked, config.max_tokens) if isinstance(v, int) and not isinstance(v, bool)]
    if caps:
        body["max_tokens"] = min(caps)
    if config.tokens != "off":
        body.update(logprobs=True, top_logprobs=0, return_token_ids=True)
        if config.tokens == "vllm":
            body["return_tokens_as_token_ids"] = True
    body.update(config.extra_body)
    return body


def without_token_data(completion: dict[str, Any], *, keep_logprobs: bool) -> dict[str, Any]:
    """The completion without the token ids (and logprobs, unless the program asked for them)."""
    out = {k: v for k, v in completion.items() if k not in _TOKEN_FIELDS}
    choices = []
    for choice in out.get("choices") or []:
        kept = choice
        if isinstance(choice, dict):
            kept = {k: v for k, v in choice.items() if k not in _TOKEN_FIELDS}
            if not keep_logprobs:
                kept["logprobs"] = None
        choices.append(kept)
    out["choices"] = choices
    return out


class GatewayActivities:
    """The `model_call` activity, on the shared queue, with the worker's model client.

    Args:
        model: The worker's model activities (client, key, defaults).
    """

    def __init__(self, model: ModelActivities) -> None:
        self._model = model

    @activity.defn(name="model_call")
    async def model_call(self, input: ModelCallInput) -> ModelCallResult:
        """Send one of a program's model calls upstream and record its answer.

        Raises:
            ApplicationError: ``MODEL_ERROR`` (retryable), ``CONTEXT_LENGTH`` or ``MODEL_REJECTED``
                (non-retryable), as `generate` raises them.
        """
        config = input.model
        body = upstream_body(config, input.request, default_model=self._model.default_model)
        completion = await self._model.complete(config, body)
        result = ModelCallResult(
            completion=without_token_data(completion, keep_logprobs=bool(input.request.get("logprobs"))),
            usage=completion_usage(completion),
        )
        if config.tokens != "off":
            prompt_ids, completion_ids, logprobs = completion_token_data(completion)
            if prompt_ids is not None and completion_ids is not None:
                result.tokens, result.token_prefix = turn_tokens(
                    turn=input.turn,
                    prompt_ids=prompt_ids,
                    completion_ids=completion_ids,
                    logprobs=logprobs,
                    prefix=input.token_prefix,
                )
        limit = self._model.payload_limit_bytes
        if limit is not None and (size := json_bytes(result)) > limit - REPLY_SLACK_BYTES:
            raise non_retryable(
                f"the model's reply is {size} bytes, over the {limit}-byte payload limit of this deployment's "
                "history; set GYMFLOW_PAYLOAD_STORAGE_URI to store large payloads externally",
                type=MODEL_ERROR,
            )
        return result
