"""The model boundary: one chat completion against an OpenAI-compatible endpoint.

`ModelActivities` owns one `aiohttp.ClientSession` per worker, so connections to the model server
are reused across rollouts. The client does not retry: Temporal's RetryPolicy is the only retry
loop, and every failure is raised as an `ApplicationError` whose type says whether retrying can
help (see `gymflow.activities.errors`):

* connection errors, timeouts, HTTP 408/409/429/5xx, and a 200 that is not a chat completion ->
  retryable ``MODEL_ERROR`` (``Retry-After`` becomes ``next_retry_delay``);
* a 400 about the context length -> non-retryable ``CONTEXT_LENGTH`` (the workflow ends the rollout
  with ``TerminationReason.CONTEXT_BUDGET``; the next attempt would be just as long);
* any other 4xx, or no endpoint configured -> non-retryable ``MODEL_REJECTED``.

`ModelConfig` travels in workflow input and history, so it holds no secrets: the API key is worker
configuration, passed to `ModelActivities`, and scrubbed from every error message.

The HTTP half (gymflow.activities.chat_endpoint: the owned client, the key, heartbeats and the
error mapping) is shared with the judge activity (`gymflow.activities.judge`), which maps the same
failures to its own error types (`EndpointErrors`).
"""

from __future__ import annotations

from typing import Any, Literal

import aiohttp
from pydantic import Field
from temporalio import activity

from gymflow.activities.chat_endpoint import ChatEndpoint, EndpointErrors, completion_usage
from gymflow.activities.errors import MODEL_ERROR, MODEL_REJECTED, non_retryable
from gymflow.envs.contract import Message, ToolSpec, Usage, Wire, json_bytes
from gymflow.envs.wire import chat
from gymflow.envs.wire.images import render_messages_with_images
from gymflow.envs.wire.roles import role_view
from gymflow.envs.wire.tokens import TokenPrefix, TurnTokens, completion_token_data, turn_tokens


class ModelConfig(Wire):
    """Which model to call and how to sample. Part of workflow input: never put secrets here."""

    base_url: str | None = None
    """OpenAI-compatible base URL including ``/v1`` (``http://host:8000/v1``); None uses the
    worker's default."""
    model: str = Field(default="", max_length=512)
    """Model name sent to the server; empty uses the worker's default (or the server's only model)."""
    tool_format: Literal["native", "hermes"] = "native"
    """``native``: OpenAI ``tools``/``tool_calls``. ``hermes``: tools in the system prompt and
    ``<tool_call>`` text, for servers without a tool-call parser."""
    temperature: float | None = Field(default=None, ge=0)
    """Sampling temperature; None leaves the server's default."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling mass; None leaves the server's default."""
    max_tokens: int | None = Field(default=1024, ge=1)
    """Most tokens one completion may generate; None leaves the server's default."""
    seed: int | None = None
    """Sampling seed, for servers that honour it."""
    stop: list[str] | None = None
    """Stop sequences."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Extra request fields (``top_k``, ``chat_template_kwargs``, ...), merged in last as the
    OpenAI client's ``extra_body`` is."""
    request_timeout_s: float = Field(default=300, gt=0, le=7 * 24 * 3600)
    """Seconds to wait for one completion before the attempt fails (and is retried)."""
    tokens: Literal["off", "vllm", "sglang"] = "off"
    """Record per turn the prompt and completion token ids and logprobs (`Trajectory.tokens`):
    ``vllm`` asks with ``logprobs``, ``return_token_ids`` and ``return_tokens_as_token_ids`` (vLLM
    0.10.2+ answers ``prompt_token_ids``/``token_ids``; older ones only the ``token_id:N`` logprob
    tokens), ``sglang`` with ``logprobs`` and ``return_token_ids``. Either shape of answer is read.
    A turn whose answer has no token data is recorded without (`Trajectory.token_sequence` names it)."""
    images: bool = False
    """The model takes images: the images MCP tools return reach it as OpenAI ``image_url`` parts
    (``data:`` URLs, in a user message after the tool results). Off, it reads the tool text's
    placeholder for each (``[image: image/png, 12 KB]``)."""
    version: int | None = Field(default=None, ge=0)
    """The policy version behind this endpoint (a trainer step): recorded on every turn it plays
    (`Trajectory.versions`), so a trainer knows which weights produced each token. A running rollout
    moves to a newer one when its trainer announces it (`PolicyUpdate`)."""
    local_activity: bool = False
    """Run each turn as a local activity of the workflow's worker: one server round trip per turn
    fewer and no conversation in history, for short turns. A generation then holds a workflow task
    slot while it runs, and stopping a worker waits for its in-flight turns (gymflow.workflows.rollout)."""


def chat_body(
    config: ModelConfig, messages: list[dict[str, Any]], *, default_model: str = "", tools: Any = None
) -> dict[str, Any]:
    """A chat completion request: messages, model name, tools, the sampling settings that are set,
    and `ModelConfig.extra_body` merged in last."""
    body: dict[str, Any] = {"messages": messages}
    model = config.model or default_model
    if model:  # vLLM and SGLang serve their only model when none is named
        body["model"] = model
    if tools is not None:
        body["tools"] = tools
    sampling = {
        "temperature": config.temperature,
        "top_p": config.top_p,
        "max_tokens": config.max_tokens,
        "seed": config.seed,
        "stop": config.stop,
    }
    body.update((key, value) for key, value in sampling.items() if value is not None)
    if config.tokens != "off":
        body.update(logprobs=True, top_logprobs=0, return_token_ids=True)
        if config.tokens == "vllm":
            body["return_tokens_as_token_ids"] = True
    body.update(config.extra_body)
    return body


class GenerateInput(Wire):
    """One model turn of a rollout."""

    compact_json = True

    model: ModelConfig
    """Endpoint and sampling settings."""
    messages: list[Message]
    """The conversation so far, system prompt first."""
    tools: list[ToolSpec] = Field(default_factory=list)
    """Tools the model may call."""
    rollout_id: str
    """The rollout this turn belongs to (for logs)."""
    turn: int
    """Turn number within the rollout; makes generated tool call ids unique."""
    token_prefix: TokenPrefix | None = None
    """The previous turn's prompt + completion tokens (length, digest), when token data is on: the
    prompt is checked to extend it and only the new tokens are recorded (gymflow.envs.wire.tokens)."""
    speaker: str | None = None
    """The role playing this turn, in a rollout of several (`BaseEnv.roles`): its model is sent the
    conversation as that role sees it (gymflow.envs.wire.roles.role_view), `token_prefix` is that role's
    own, and the reply and its token data are tagged with it."""


class GenerateResult(Wire):
    """The model's answer for one turn."""

    compact_json = True

    message: Message
    """The assistant message. Tool calls are parsed (malformed ones kept with ``parse_error``); in
    hermes format the content is the model's text verbatim, ``<tool_call>`` blocks included, so
    the transcript holds exactly what the model wrote and shows it to the model next turn."""
    finish_reason: str
    """As the server reported it: ``stop``, ``tool_calls``, ``length``, ..."""
    usage: Usage
    """This turn's tokens; ``last_prompt_tokens`` equals ``prompt_tokens``."""
    model: str
    """The model name the server reported."""
    tokens: TurnTokens | None = None
    """This turn's token ids and logprobs, when `ModelConfig.tokens` is on and the endpoint gave them."""
    token_prefix: TokenPrefix | None = None
    """This turn's prompt + completion, for the next turn's `GenerateInput.token_prefix`."""


REPLY_SLACK_BYTES = 64 * 1024
"""Room a reply leaves, under the payload limit, for the rest of what carries it."""
MODEL_ENDPOINT = EndpointErrors(
    retryable=MODEL_ERROR,
    rejected=MODEL_REJECTED,
    name="model",
    url_source="ModelConfig.base_url or the worker's default model URL",
)


class ModelActivities:
    """Activities for OpenAI-compatible chat endpoints (vLLM, SGLang, OpenAI, the policy server).

    Args:
        default_base_url: Endpoint used when `ModelConfig.base_url` is None.
        default_model: Model name used when `ModelConfig.model` is empty.
        api_key: Sent as ``Authorization: Bearer``; never logged or put in errors.
        http: A client to use instead of the owned one (tests); the caller closes it.
        payload_limit_bytes: The largest payload the deployment's history takes inline (None:
            large payloads go to external storage); a reply over it is refused, not sent.
    """

    def __init__(
        self,
        *,
        default_base_url: str | None,
        default_model: str = "",
        api_key: str | None = None,
        http: aiohttp.ClientSession | None = None,
        payload_limit_bytes: int | None = None,
    ) -> None:
        self._payload_limit_bytes = payload_limit_bytes
        self._default_base_url = default_base_url
        self._default_model = default_model
        self._endpoint = ChatEndpoint(errors=MODEL_ENDPOINT, api_key=api_key, http=http)

    async def aclose(self) -> None:
        """Close the owned HTTP client (a client passed in is left to its owner)."""
        await self._endpoint.aclose()

    @property
    def default_model(self) -> str:
        """The model name used when `ModelConfig.model` is empty."""
        return self._default_model

    @property
    def payload_limit_bytes(self) -> int | None:
        """The largest reply the deployment's history takes inline (None: no limit)."""
        return self._payload_limit_bytes

    async def complete(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion of `body` at `config`'s endpoint (the worker's default when it names
        none), with this worker's key and error mapping (`ChatEndpoint.complete`)."""
        return await self._endpoint.complete(
            config.base_url or self._default_base_url, body, timeout_s=config.request_timeout_s
        )

    @activity.defn(name="generate")
    async def generate(self, input: GenerateInput) -> GenerateResult:
        """Ask the model for the next assistant message.

        Raises:
            ApplicationError: ``MODEL_ERROR`` (retryable), ``CONTEXT_LENGTH`` or ``MODEL_REJECTED``
                (non-retryable); see the module docstring.
        """
        config = input.model
        render = render_messages_with_images if config.images else chat.render_messages
        seen = input.messages if input.speaker is None else role_view(input.messages, input.speaker)
        body = chat_body(
            config,
            render(seen, input.tools, config.tool_format),
            default_model=self._default_model,
            tools=chat.render_tools(input.tools, config.tool_format),
        )
        completion = await self._endpoint.complete(
            config.base_url or self._default_base_url, body, timeout_s=config.request_timeout_s
        )
        choice = completion["choices"][0]
        message = chat.parse_assistant_message(choice["message"], config.tool_format, id_prefix=f"call_{input.turn}")
        if input.speaker is not None:
            message.speaker = input.speaker
        result = GenerateResult(
            message=message,
            finish_reason=str(choice.get("finish_reason") or ""),
            usage=completion_usage(completion),
            model=str(completion.get("model") or config.model or self._default_model),
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
                    speaker=input.speaker,
                )
        limit = self._payload_limit_bytes
        if limit is not None and (size := json_bytes(result)) > limit - REPLY_SLACK_BYTES:
            # Temporal would refuse to record it (and word it as TMPRL1103); no model turn is this long.
            raise non_retryable(
                f"the model's reply is {size} bytes, over the {limit}-byte payload limit of this "
                "deployment's history (a broken endpoint?); set GYMFLOW_PAYLOAD_STORAGE_URI to store "
                "large payloads externally",
                type=MODEL_ERROR,
            )
        return result
