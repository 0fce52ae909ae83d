"""Plot a training run: reward per step, and each checkpoint's eval against the baseline.

    python -m bench.training_curve MANIFEST [--out bench/out/training.png]

MANIFEST is a run's `runs/<run id>/manifest.json` (a path, file:// or s3:// URI). Prints the
figures as JSON and writes the PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from gymflow.activities.storage import base_of, open_store


def figures(manifest: dict[str, Any]) -> dict[str, Any]:
    """Reward per step and the evals, from a run manifest."""
    steps = [(int(h["step"]), h["reward"]) for h in manifest.get("history", []) if "reward" in h and h["step"] > 0]
    evals = [c["eval"] for c in manifest.get("checkpoints", []) if c.get("eval") and c["eval"].get("mean") is not None]
    return {"run_id": manifest["run_id"], "status": manifest["status"], "reward_per_step": steps, "evals": evals}


def plot(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if data["reward_per_step"]:
        xs, ys = zip(*data["reward_per_step"], strict=True)
        ax.plot(xs, ys, marker=".", label="training reward (GRPO groups, mean per step)")
    for i, ev in enumerate(data["evals"]):
        err = [[ev["mean"] - ev["mean_low"]], [ev["mean_high"] - ev["mean"]]]
        ax.errorbar([ev["step"]], [ev["mean"]], yerr=err, fmt="s", color="C2", capsize=4,
                    label="checkpoint eval (95% CI)" if i == 0 else None)  # fmt: skip
        ax.annotate(f"P(impr.) {ev['probability_of_improvement']:.2f}", (ev["step"], ev["mean"]),
                    textcoords="offset points", xytext=(-40, -18), fontsize=8)  # fmt: skip
    if data["evals"]:
        ax.axhline(data["evals"][0]["baseline_mean"], color="C3", ls="--", label="baseline (starting policy) eval")
    ax.set(xlabel="step", ylabel="reward", ylim=(-0.05, 1.05), title=f"training run {data['run_id']}")
    ax.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


async def read(uri: str) -> dict[str, Any]:
    return dict(json.loads(await open_store(base_of(uri)).get(uri)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("manifest")
    parser.add_argument("--out", type=Path, default=Path("bench/out/training.png"))
    args = parser.parse_args()
    uri = args.manifest if "://" in args.manifest else Path(args.manifest).resolve().as_uri()
    data = figures(asyncio.run(read(uri)))
    plot(data, args.out)
    print(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
