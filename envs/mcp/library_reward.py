"""The reward library (gymflow.envs.rewards) in an env file: comparisons and checks named with parameters.

The library's functions take plain values, not the env's reward signature: a comparison is
`fn(prediction, truth, **params)` (`exact_match`, `normalized_match`, `token_f1`,
`numeric_close`, `math_equivalent`, ...), a check is `fn(text, **params)` (`tag_format_score`,
`follows_tag_format`, `matches_pattern`). An adapter reads the prediction out of the final
assistant message and calls them:

    reward:
      - fn: math_equivalent          # a comparison: fn(prediction, ground_truth, **args)
        extract: answer_tag          # how the prediction is read (below)
        args: {rel_tol: 1.0e-3}
      - check: tag_format_score      # a check of the final message: fn(text, **args)
        args: {tags: [answer]}
        weight: 0.1                  # the score is multiplied by this (default 1)
        name: format                 # the reward component's name (default: the function's)

`fn` / `check` is a function of gymflow.envs.rewards by name, or any `module:function` / `file.py:function`.
`extract` (default `answer` for `fn`, `text` for `check`):

* `answer`: the last `<answer>...</answer>` (with `\\boxed{}` unwrapped); a message without
  one is taken whole. This is also the rule of an env file without `reward:`, which scores
  `{fn: exact_match, extract: answer}` (component `exact_match`).
* `answer_tag`: the last `<answer>` only; no tag scores 0 (the function is not called).
* `tag:NAME`: the same with another tag. `boxed`: the last `\\boxed{...}`; none scores 0.
* `text`: the whole final message, stripped.

The ground truth goes to the function as text (a number becomes "42"; a list stays a list of
texts, several references); a task without one scores 0. The result (bool or number) times
`weight` is the component. Every function is checked against the call it will get when the file
loads (`signature_problem`), so a signature that cannot work is an error naming it, not a failed
rollout.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from gymflow.envs import rewards as reward_library
from gymflow.envs.contract import Wire
from gymflow.envs.mcp.reward import signature_problem
from gymflow.envs.plugins import load_callable
from gymflow.envs.rewards.extract import extract_answer, extract_boxed, extract_tag

EXTRACTORS = ("answer", "answer_tag", "boxed", "text")
_TAG_RE = re.compile(r"tag:([A-Za-z_][\w.-]*)")


class LibraryRewardSpec(Wire):
    """One `reward:` entry that names a library function (see the module doc)."""

    fn: str | None = None
    """A comparison `fn(prediction, ground_truth, **args)`: a name in gymflow.envs.rewards or module:function."""
    check: str | None = None
    """A check `fn(text, **args)` of the final message: a name in gymflow.envs.rewards or module:function."""
    extract: str | None = None
    """answer | answer_tag | tag:NAME | boxed | text (default: answer for fn, text for check)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the function."""
    weight: float = 1.0
    """Factor on the function's score."""
    name: str | None = None
    """Name of the reward component (default: the function's name)."""

    @model_validator(mode="after")
    def _one_function(self) -> LibraryRewardSpec:
        if (self.fn is None) == (self.check is None):
            raise ValueError("give exactly one of 'fn' (a comparison) or 'check' (a check of the text)")
        if self.extract is not None and self.extract not in EXTRACTORS and not _TAG_RE.fullmatch(self.extract):
            raise ValueError(f"'extract' must be one of {', '.join(EXTRACTORS)} or tag:NAME, got {self.extract!r}")
        return self


class LibraryReward:
    """A library function wrapped in the env reward signature (`gymflow.envs.mcp.reward`).

    Raises (at construction):
        ValueError: The function is unknown, or cannot take the call it will get; the message
            names the expected signature.
    """

    def __init__(self, spec: LibraryRewardSpec, *, base_dir: Path | None = None, field: str = "reward") -> None:
        kind = "fn" if spec.fn is not None else "check"
        target = spec.fn if spec.fn is not None else spec.check
        assert target is not None
        where = f"{field}.{kind}"
        self.function = _resolve(target, base_dir=base_dir, field=where)
        self.compare = kind == "fn"
        self.extract = spec.extract or ("answer" if self.compare else "text")
        self.args = dict(spec.args)
        self.weight = spec.weight
        self.__name__: str = spec.name or str(getattr(self.function, "__name__", "reward"))
        expected = "fn(prediction, ground_truth, **args)" if self.compare else "fn(text, **args)"
        sample = ("", "") if self.compare else ("",)
        problem = signature_problem(self.function, *sample, **self.args)
        if problem is not None:
            raise ValueError(f"{where}: {problem}; a '{kind}' reward is called as {expected} with args {self.args}")

    def __call__(self, completion: str, ground_truth: Any, **kwargs: Any) -> float:
        """The weighted score of the final message `completion` (the env reward signature)."""
        del kwargs
        prediction = extracted(completion, self.extract)
        if prediction is None:
            return 0.0
        if not self.compare:
            return self.weight * float(self.function(prediction, **self.args))
        truth = truth_text(ground_truth)
        if truth is None:
            return 0.0
        return self.weight * float(self.function(prediction, truth, **self.args))


def extracted(text: str, how: str) -> str | None:
    """The prediction `how` reads out of a final message (None: there is none, the score is 0)."""
    if how == "answer":
        answer = extract_answer(text)
        return answer if answer is not None else text.strip()
    if how == "answer_tag":
        return extract_answer(text)
    if how == "boxed":
        boxed = extract_boxed(text)
        return boxed.strip() if boxed is not None else None
    if how == "text":
        return text.strip()
    match = _TAG_RE.fullmatch(how)
    if match is None:
        raise ValueError(f"unknown extract rule {how!r}")
    return extract_tag(text, match.group(1))


def truth_text(ground_truth: Any) -> str | list[str] | None:
    """The ground truth as the library's comparisons take it: text, or a list of texts."""
    if ground_truth is None:
        return None
    if isinstance(ground_truth, list | tuple):
        return [str(item) for item in ground_truth]
    return str(ground_truth)


def _resolve(target: str, *, base_dir: Path | None, field: str) -> Callable[..., Any]:
    if ":" in target:
        return load_callable(target, base_dir=base_dir, field=field)
    library: Mapping[str, Any] = {name: getattr(reward_library, name) for name in reward_library.__all__}
    fn = library.get(target)
    if not callable(fn) or isinstance(fn, type):
        choices = ", ".join(sorted(n for n, f in library.items() if callable(f) and not isinstance(f, type)))
        raise ValueError(  # noqa: TRY004 - a config error
            f"{field}: no function {target!r} in the reward library (gymflow.envs.rewards); choose one of {choices}, "
            "or name any function as module:function or file.py:function"
        )
    return fn


DEFAULT_REWARD = LibraryReward(LibraryRewardSpec(fn="exact_match", extract="answer"))
"""The reward of an env without reward functions: exact match of the final answer."""
