"""The judge boundary: an LLM scores a transcript against a rubric, over any OpenAI-compatible
chat endpoint (vLLM, SGLang, OpenAI, a proxy).

`JudgeActivities` renders the prompt and parses the reply with the pure half of the judge
(`gymflow.envs.rewards.judge`), so what is sent and how the reply is read are the same code a test or
a workflow can run. The HTTP half is `gymflow.activities.model.ChatEndpoint`, shared with the model
activity: one owned aiohttp session that never retries (Temporal's RetryPolicy is the only retry
loop), the API key from worker configuration (never from input, scrubbed from errors), and the
same failure mapping under the judge's own error types (`gymflow.activities.errors`):

* connection errors, timeouts, HTTP 408/409/429/5xx, a 200 that is not a chat completion ->
  retryable ``JUDGE_ERROR`` (``Retry-After`` becomes ``next_retry_delay``);
* any other 4xx, no endpoint -> non-retryable ``JUDGE_REJECTED`` (a 400 about the context length
  -> non-retryable ``CONTEXT_LENGTH``);
* a reply without usable scores (no JSON, a criterion missing, a score that is not a number) ->
  retryable ``JUDGE_REPLY_INVALID``: a sampled judge often answers properly on the next attempt,
  and the caller's RetryPolicy bounds how many it gets. With a greedy judge, list the type in
  ``non_retryable_error_types`` instead.

Judges are usually shared, rate-limited APIs. Schedule this activity on its own task queue
(`gymflow.activities.names.JUDGE_TASK_QUEUE`) and poll that queue with workers built by
`gymflow.workers.judge_worker.judge_worker`, which sets ``max_task_queue_activities_per_second``: a limit
the Temporal server enforces for the queue as a whole, so it holds however many judge workers
run (each worker's own ``max_activities_per_second`` would multiply with their number).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

import aiohttp
from pydantic import Field
from temporalio import activity

from gymflow.activities.chat_endpoint import ChatEndpoint, EndpointErrors, completion_usage
from gymflow.activities.errors import JUDGE_ERROR, JUDGE_REJECTED, JUDGE_REPLY_INVALID, retryable
from gymflow.activities.model import ModelConfig, chat_body
from gymflow.envs.contract import Message, Reward, Usage, Wire
from gymflow.envs.errors import JudgeParseError
from gymflow.envs.rewards.group_judge import parse_group_reply, render_group_prompt
from gymflow.envs.rewards.judge import JudgeVerdict, OutOfRange, parse_judge_reply, render_judge_prompt, verdict_reward
from gymflow.envs.wire.rubric import Rubric

JUDGE_ENDPOINT = EndpointErrors(
    retryable=JUDGE_ERROR,
    rejected=JUDGE_REJECTED,
    name="judge",
    url_source="JudgeInput.model.base_url or the judge worker's default URL",
)
_EXCERPT_CHARS = 300
T = TypeVar("T")


class JudgeConfig(Wire):
    """How a rollout is judged."""

    rubric: Rubric | None = None
    """The criteria; None uses the env's rubric for the task."""
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(temperature=0.0))
    """Judge endpoint and sampling; base_url None uses the worker's GYMFLOW_JUDGE_URL."""
    weight: float = Field(default=1.0, ge=0)
    """Weight of the judge's total in the rollout's reward."""
    combine: Literal["add", "replace"] = "add"
    """`add`: env total + weight x judge total; `replace`: weight x judge total alone."""
    attempts: int = Field(default=3, ge=1, le=20)
    """Judge calls at most (retryable failures: connection, 429, 5xx, unusable replies)."""


class JudgeInput(Wire):
    """What to grade and how. Part of workflow history: never put secrets here."""

    rubric: Rubric
    """The criteria to score."""
    prompt: str | list[Message]
    """The task as the graded model saw it (`Task.prompt`)."""
    transcript: list[Message]
    """The messages to grade, usually the rollout's completion; system messages are left out."""
    ground_truth: Any = None
    """A reference answer shown to the judge; omitted when None."""
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(temperature=0.0))
    """The judge endpoint and sampling (``tool_format`` is unused). Greedy by default: a judge
    should grade the same transcript the same way."""
    json_mode: bool = False
    """Ask for ``response_format={"type": "json_object"}`` (for servers that support it)."""
    out_of_range: OutOfRange = "clamp"
    """Scores outside a criterion's scale: ``clamp`` them (recorded in the verdict) or treat the
    reply as invalid (``error``)."""
    max_transcript_chars: int = Field(default=24_000, ge=1_000)
    """Budget of the transcript in the prompt; longer ones keep their start and (mostly) end."""
    max_field_chars: int = Field(default=8_000, ge=500)
    """Budget of the task and of the reference answer, each."""


class JudgeResult(Wire):
    """The judge's verdict and the Reward it aggregates to."""

    reward: Reward
    """`gymflow.envs.rewards.rubric.aggregate` of the scores: the total plus one component per criterion."""
    verdict: JudgeVerdict
    """Scores, reasons, clamped scores and the repairs the reply needed."""
    model: str
    """The judge model the server reported."""
    usage: Usage
    """The judge call's tokens."""


class GroupJudgeConfig(Wire):
    """How a group's trajectories are judged against each other (gymflow.envs.rewards.group_judge)."""

    criteria: str = (
        "Which attempt best accomplishes the task? Prefer correct, complete answers, reached with "
        "appropriate tool use and without needless steps."
    )
    """What the judge compares the attempts on."""
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(temperature=0.0))
    """Judge endpoint and sampling; base_url None uses the worker's GYMFLOW_JUDGE_URL."""
    orders: int = Field(default=2, ge=1, le=8)
    """Calls per group, each showing the trajectories in another order (a shuffle, its reverse, ...),
    to cancel the judge's position bias."""
    seed: int = 0
    """Seed of the orders."""
    weight: float = Field(default=1.0, ge=0)
    """Weight of the judge's normalised score (0 to 1) in each sample's reward."""
    combine: Literal["add", "replace"] = "add"
    """`add`: sample reward + weight x judge score; `replace`: weight x judge score alone."""
    min_agreement: float | None = Field(default=None, ge=-1, le=1)
    """When set, a group whose orders agree less than this (Spearman) is not judged: its samples keep
    their own rewards, and the result says why (a judge that ranks by position teaches nothing)."""
    attempts: int = Field(default=3, ge=1, le=20)
    """Calls per order at most (retryable failures: connection, 429, 5xx, unusable replies)."""
    max_trajectory_chars: int = Field(default=6_000, ge=200)
    """Budget of each trajectory in the prompt (its end kept preferentially)."""


class GroupJudgeInput(Wire):
    """One judge call over a group, in one order. Part of workflow history: never put secrets here."""

    criteria: str
    prompt: str | list[Message]
    """The task as the samples saw it (`Task.prompt`)."""
    transcripts: list[list[Message]]
    """The group's completions, in the group's order."""
    order: list[int]
    """The order to show them in (indices into `transcripts`)."""
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(temperature=0.0))
    max_trajectory_chars: int = 6_000


class GroupJudgeResult(Wire):
    """One order's scores (0 to 10), aligned with the group's trajectories."""

    scores: list[float]
    model: str
    usage: Usage


class JudgeActivities:
    """The ``judge`` activity, for OpenAI-compatible chat endpoints.

    Args:
        default_base_url: Judge endpoint (``http://host:8000/v1``) used when the input names none.
        default_model: Model name used when the input names none.
        api_key: Sent as ``Authorization: Bearer``; worker configuration, never logged or put in
            errors.
        http: A client to use instead of the owned one (tests); the caller closes it.
    """

    def __init__(
        self,
        *,
        default_base_url: str | None,
        default_model: str = "",
        api_key: str | None = None,
        http: aiohttp.ClientSession | None = None,
    ) -> None:
        self._default_base_url = default_base_url
        self._default_model = default_model
        self._endpoint = ChatEndpoint(errors=JUDGE_ENDPOINT, api_key=api_key, http=http)

    async def aclose(self) -> None:
        """Close the owned HTTP client (a client passed in is left to its owner)."""
        await self._endpoint.aclose()

    async def _ask(
        self, config: ModelConfig, messages: list[Message], parse: Callable[[str], T], *, json_mode: bool = False
    ) -> tuple[T, dict[str, Any]]:
        """Send the judge its conversation; `parse` of its reply's text, and the whole completion.

        Raises:
            ApplicationError: the endpoint's failure, or `JUDGE_REPLY_INVALID` for a reply without
                text or one `parse` rejects (`JudgeParseError`).
        """
        wire = [{"role": m.role, "content": m.content} for m in messages]
        body = chat_body(config, wire, default_model=self._default_model)
        if json_mode:
            body.setdefault("response_format", {"type": "json_object"})
        completion = await self._endpoint.complete(
            config.base_url or self._default_base_url, body, timeout_s=config.request_timeout_s
        )
        content = completion["choices"][0]["message"].get("content")
        if not isinstance(content, str) or not content.strip():
            raise retryable("judge reply has no text content", type=JUDGE_REPLY_INVALID)
        try:
            return parse(content), completion
        except JudgeParseError as exc:
            excerpt = " ".join(content.split())[:_EXCERPT_CHARS]
            raise retryable(self._endpoint.scrub(f"{exc} (reply: {excerpt!r})"), type=JUDGE_REPLY_INVALID) from None

    def _model_of(self, completion: dict[str, Any], config: ModelConfig) -> str:
        return str(completion.get("model") or config.model or self._default_model)

    @activity.defn(name="judge")
    async def judge(self, input: JudgeInput) -> JudgeResult:
        """Have the judge score the transcript against the rubric.

        Raises:
            ApplicationError: ``JUDGE_ERROR`` or ``JUDGE_REPLY_INVALID`` (retryable),
                ``JUDGE_REJECTED`` or ``CONTEXT_LENGTH`` (non-retryable); see the module docstring.
        """
        messages = render_judge_prompt(
            input.rubric,
            prompt=input.prompt,
            transcript=input.transcript,
            ground_truth=input.ground_truth,
            max_transcript_chars=input.max_transcript_chars,
            max_field_chars=input.max_field_chars,
        )
        verdict, completion = await self._ask(
            input.model,
            messages,
            lambda text: parse_judge_reply(text, input.rubric, out_of_range=input.out_of_range),
            json_mode=input.json_mode,
        )
        return JudgeResult(
            reward=verdict_reward(input.rubric, verdict),
            verdict=verdict,
            model=self._model_of(completion, input.model),
            usage=completion_usage(completion),
        )

    @activity.defn(name="judge_group")
    async def judge_group(self, input: GroupJudgeInput) -> GroupJudgeResult:
        """Have the judge score a group's trajectories against each other, shown in `input.order`.

        Raises:
            ApplicationError: as `judge`.
        """
        messages = render_group_prompt(
            input.criteria,
            prompt=input.prompt,
            transcripts=input.transcripts,
            order=input.order,
            max_trajectory_chars=input.max_trajectory_chars,
        )
        scores, completion = await self._ask(input.model, messages, lambda text: parse_group_reply(text, input.order))
        return GroupJudgeResult(
            scores=scores, model=self._model_of(completion, input.model), usage=completion_usage(completion)
        )
