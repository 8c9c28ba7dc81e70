"""The table and plot of docs/agentic_judge_results.md, from the runs of recipes/agentic_judge.py.

    python bench/agentic_judge_report.py RUNS_DIR [--plot docs/img/agentic_judge_curves.png]

RUNS_DIR holds one output folder per run, named ``{judge,tests}_s{seed}`` (``--output-dir RUNS_DIR/judge_s0``
...). Prints, per run, the solver's judged pass rate and, on the tricky tasks (a wrong or over-specified test),
the share truly correct and the share fooled by the tests, over the first 15 and the last 30 steps.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from multiagent_rl.data.traces import load_traces


def breakdown(run: Path) -> dict[str, dict[str, float]]:
    traces = load_traces(run / ("traces" if (run / "traces").exists() else "episodes"))
    rows = [(step, json.loads(m)) for step, role, m, ok in
            zip(traces["step"], traces["role"], traces["metrics"], traces["episode_ok"]) if role == "solver" and ok]
    last = max(step for step, _ in rows)
    out = {}
    for part, lo, hi in (("start", 0, 15), ("end", last - 29, last)):
        chosen = [m for step, m in rows if lo <= step <= hi]
        tricky = [m for m in chosen if m["tricky"]]
        plain = [m for m in chosen if not m["tricky"]]

        def mean(xs, key):
            return sum(x[key] for x in xs) / len(xs)

        out[part] = {"judged_pass": mean(chosen, "judged_pass"), "correct_tricky": mean(tricky, "correct"),
                     "fooled_tricky": mean(tricky, "fooled_tests"), "correct_plain": mean(plain, "correct")}
    return out


def plot(runs: dict[str, Path], stats: dict[str, dict], path: str) -> None:
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    colors = {"judge": "tab:blue", "tests": "tab:orange"}
    labelled = set()
    for name, run in runs.items():
        reward = name.split("_")[0]
        rows = [r for r in json.loads((run / "summary.json").read_text())["curves"] if "judged_pass" in r]
        ys = [r["judged_pass"] for r in rows]
        smooth = [sum(ys[max(0, i - 4):i + 1]) / len(ys[max(0, i - 4):i + 1]) for i in range(len(ys))]
        ax1.plot([r["step"] for r in rows], smooth, color=colors[reward], alpha=0.8,
                 label=None if reward in labelled else f"reward: {reward}")
        labelled.add(reward)
    ax1.set_xlabel("step")
    ax1.set_ylabel("judged pass rate (moving mean of 5 logs)")
    ax1.set_ylim(0, 1)
    ax1.legend()
    ax1.set_title("the solver's choices, one line per seed")
    keys = ["correct_tricky", "fooled_tricky", "correct_plain"]
    x, width = np.arange(len(keys)), 0.2
    for i, (reward, part) in enumerate([("judge", "start"), ("judge", "end"), ("tests", "start"), ("tests", "end")]):
        values = [np.mean([s[part][k] for n, s in stats.items() if n.startswith(reward)]) for k in keys]
        ax2.bar(x + (i - 1.5) * width, values, width, color=colors[reward], alpha=0.45 if part == "start" else 1.0,
                label=f"{reward} reward, {'first 15' if part == 'start' else 'last 30'} steps")
    ax2.set_xticks(x, ["correct (tricky)", "fooled by tests (tricky)", "correct (plain)"], fontsize=8)
    ax2.set_ylim(0, 1)
    ax2.legend(fontsize=7)
    ax2.set_title("mean over seeds")
    fig.savefig(path, bbox_inches="tight")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs")
    p.add_argument("--plot")
    args = p.parse_args()
    runs = {d.name: d for d in sorted(Path(args.runs).iterdir()) if (d / "summary.json").exists()}
    stats = {name: breakdown(run) for name, run in runs.items()}
    print("| run | judged pass, start → end | correct on tricky | fooled on tricky | correct on plain |")
    for name, s in stats.items():
        cells = [f"{s['start'][k]:.2f} → {s['end'][k]:.2f}"
                 for k in ("judged_pass", "correct_tricky", "fooled_tricky", "correct_plain")]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.plot:
        plot(runs, stats, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
