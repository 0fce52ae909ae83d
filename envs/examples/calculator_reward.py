"""The reward of envs/examples/calculator.yaml: the answer must match, checked on the live server."""

from pathlib import Path
from typing import Any

from gymflow.envs.builtin.math.rewards import extract_answer
from gymflow.envs.mcp.reward import RolloutTools


async def correct(
    completion: str, ground_truth: Any, workspace: Path, mcp_client: RolloutTools, **kwargs: Any
) -> float:
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    # Ask the rollout's own calculator whether answer - truth is 0: exact, whatever the notation.
    check = await mcp_client.call_tool("evaluate", {"expression": f"({answer}) - ({ground_truth})"})
    return float(not check.is_error and float(check.text) == 0)
