"""The learning curve: held-out success and reward against environment steps, SFT->RL boundary marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_learning_curve(rows: list[dict[str, Any]], path: Path, *, final: dict[str, Any] | None = None) -> Path:
    """Plot probe evaluations of the sft and rl stages; returns ``path``."""
    pts = [r for r in rows if "success" in r and r["stage"] in ("sft", "rl")]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax2 = ax.twinx()
    last_sft = [r for r in pts if r["stage"] == "sft"][-1:]
    for stage, color in (("sft", "tab:blue"), ("rl", "tab:orange")):
        rows_ = [r for r in pts if r["stage"] == stage]
        if stage == "rl" and rows_:
            rows_ = last_sft + rows_  # RL starts where SFT ended
        xs = [r["env_steps"] for r in rows_]
        ax.plot(xs, [r["success"] for r in rows_], "o-", color=color, label=f"{stage} success")
        ax2.plot(xs, [r["reward"] for r in rows_], "x--", color=color, alpha=0.5, label=f"{stage} mean reward")
    sft_x = [r["env_steps"] for r in rows if r["stage"] == "sft"]
    if sft_x and any(r["stage"] == "rl" for r in rows):
        ax.axvline(max(sft_x), color="gray", linestyle=":", label="SFT -> RL")
    if final:
        for name, marker in (("sft", "s"), ("rl", "*")):
            if name in final and pts:
                x = max(r["env_steps"] for r in pts if r["stage"] == name) if any(r["stage"] == name for r in pts) else 0
                ax.plot([x], [final[name]["success"]], marker, color="black", markersize=9,
                        label=f"{name} final ({final[name]['success']:.2f})")
    ax.set_xlabel("environment steps (demonstrations, then RL rollouts)")
    ax.set_ylabel("held-out success (greedy)")
    ax2.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="lower right", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
