"""Reward of the chaos tests' counting env: the live counter must hold the ground truth.

Read from the rollout's (possibly rebuilt) server, so a recovery that replayed the calls wrong,
or twice, scores 0 and shows up.
"""

from pathlib import Path
from typing import Any

from gymflow.envs.mcp.reward import RolloutTools


async def counter_matches(
    completion: str, ground_truth: Any, workspace: Path, mcp_client: RolloutTools, **kwargs: Any
) -> float:
    value = await mcp_client.call_tool("get")
    return float(not value.is_error and value.text == str(ground_truth))
