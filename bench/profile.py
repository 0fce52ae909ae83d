"""Summarise a py-spy collapsed-stack profile: `python -m bench.profile bench/out/profile_gymflow.txt`.

Prints the share of samples spent inside each of a few areas (inclusive: a sample counts for every
area on its stack) and the functions with the most samples of their own.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

AREAS = {
    "workflow activations (sandboxed workflow code + SDK)": r"_workflow_instance\.py|workflow_sandbox",
    "  of which: sandbox module import/restore": r"workflow_sandbox/_importer|workflow_sandbox/_restrictions",
    "  of which: RolloutWorkflow / bare workflow code": r"workflows/(rollout|activity_calls)\.py|bench/bare\.py",
    "payload conversion (data converter)": r"temporalio/converter|contrib/pydantic",
    "pydantic validation / serialisation": r"pydantic",
    "activity code (gymflow activities)": r"activities/(model|env)\.py",
    "model HTTP client (httpx/httpcore)": r"httpx|httpcore",
    "chat rendering / parsing (gymflow.envs.wire.chat)": r"envs/chat\.py",
    "env code (envs/)": r"envs/(?!chat)",
    "asyncio event loop": r"asyncio/",
    "temporal bridge (Rust core calls)": r"temporalio/bridge",
}


def load(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append((frames.split(";"), int(count)))
    return stacks


def summarise(path: Path, top: int = 20) -> str:
    stacks = load(path)
    total = sum(count for _, count in stacks) or 1
    lines = [f"{path.name}: {total} samples"]
    for area, pattern in AREAS.items():
        regex = re.compile(pattern)
        hits = sum(count for frames, count in stacks if any(regex.search(f) for f in frames))
        lines.append(f"  {100 * hits / total:5.1f}%  {area}")
    own: Counter[str] = Counter()
    for frames, count in stacks:
        own[re.sub(r":\d+\)$", ")", frames[-1])] += count
    lines.append("  top self:")
    lines += [f"  {100 * c / total:5.1f}%  {frame}" for frame, c in own.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    for path in args.paths:
        print(summarise(path, args.top))


if __name__ == "__main__":
    main()
