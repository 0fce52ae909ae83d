"""The reward library: deterministic checks, rubrics and an LLM judge, group rewards.

Everything here is pure (no I/O, no temporalio), so env reward functions, the judge activity and
workflows all use the same code:

* `extract` — answers out of model text (``<answer>`` tags, ``\\boxed{}``), format checks.
* `text` — exact and SQuAD-normalised match, token F1, set IoU.
* `numeric` — number parsing, numeric tolerance, math equivalence (sympy, bounded).
* `rubric` — `Rubric` of weighted binary/ranged, positive/negative criteria, and `aggregate`.
* `judge` — the judge prompt and the forgiving parser of its reply (`JudgeParseError`).
* `group` — rank rewards, GRPO / Dr. GRPO advantages, near-duplicate diversity scaling.
"""

from gymflow.envs.errors import JudgeParseError
from gymflow.envs.rewards.extract import (
    extract_answer,
    extract_boxed,
    extract_tag,
    extract_tags,
    follows_tag_format,
    matches_pattern,
    tag_format_score,
)
from gymflow.envs.rewards.group import (
    DiversityScaling,
    completion_text,
    diversity_scale,
    group_advantages,
    grpo_advantages,
    near_duplicate_clusters,
    rank_rewards,
)
from gymflow.envs.rewards.judge import JudgeVerdict, parse_judge_reply, render_judge_prompt, verdict_reward
from gymflow.envs.rewards.numeric import math_equivalent, numeric_close, parse_number
from gymflow.envs.rewards.rubric import aggregate
from gymflow.envs.rewards.text import exact_match, normalize_answer, normalized_match, set_iou, split_items, token_f1
from gymflow.envs.wire.rubric import Criterion, Rubric

__all__ = [
    "Criterion",
    "DiversityScaling",
    "JudgeParseError",
    "JudgeVerdict",
    "Rubric",
    "aggregate",
    "completion_text",
    "diversity_scale",
    "exact_match",
    "extract_answer",
    "extract_boxed",
    "extract_tag",
    "extract_tags",
    "follows_tag_format",
    "group_advantages",
    "grpo_advantages",
    "matches_pattern",
    "math_equivalent",
    "near_duplicate_clusters",
    "normalize_answer",
    "normalized_match",
    "numeric_close",
    "parse_judge_reply",
    "parse_number",
    "rank_rewards",
    "render_judge_prompt",
    "set_iou",
    "split_items",
    "tag_format_score",
    "token_f1",
    "verdict_reward",
]
