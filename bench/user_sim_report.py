"""The table and plot of docs/user_sim_results.md, from the runs of recipes/user_sim.py.

    python bench/user_sim_report.py RUN_DIR [RUN_DIR ...] [--plot docs/img/user_sim_seeds.png]

Prints, per run and persona, the held-out greedy success at the end of the warm-up and at the last evaluation,
and plots the mean over the runs with one thin line per run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from multiagent_rl.envs.user_sim import PERSONAS

KEYS = (*PERSONAS, "all")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+")
    p.add_argument("--plot")
    args = p.parse_args()
    summaries = {Path(r).name: json.loads((Path(r) / "summary.json").read_text()) for r in args.runs}
    print("| run | " + " | ".join(KEYS) + " |")
    for name, s in summaries.items():
        warm, last = s["held_out_after_warmup"], s["held_out_last"]
        print(f"| {name} | " + " | ".join(f"{warm[k]:.2f} → {last[k]:.2f} ({100 * (last[k] - warm[k]):+.0f})"
                                           for k in KEYS) + " |")
    if not args.plot:
        return
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.2), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(KEYS), sharey=True)
    for ax, key in zip(axes, KEYS):
        curves = [[(pt["step"], pt[key]) for pt in s["held_out"]] for s in summaries.values()]
        for curve in curves:
            ax.plot(*zip(*curve), color="gray", alpha=0.5, linewidth=0.8)
        steps = [x for x, _ in curves[0]]
        ax.plot(steps, [sum(c[i][1] for c in curves) / len(curves) for i in range(len(steps))], color="tab:blue",
                linewidth=2)
        ax.axvline(steps[0], color="gray", linestyle=":")
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
    axes[0].set_ylabel("held-out success (greedy)")
    fig.savefig(args.plot, bbox_inches="tight")
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
