"""Draw the Gantt chart of one pipelined training step, one row per pipeline rank: from a run's
``timeline.json`` (``rpeg train`` of a plan whose training unit has pp > 1 writes each rank's
actions under ``pipeline_actions``; ``--step`` picks the step, default the last) or from the
action timeline ``python benchmarks/bench_pipeline.py --timeline T.json`` writes; each action:
kind F/B, model chunk, micro-batch, start, end, seconds waiting on its receive (drawn hatched).
The gaps between actions are the idle (bubble) time.

    rpeg train configs/pp2-cpu.yaml runtime.steps=3
    python benchmarks/plot_pipeline_timeline.py runs/pp2-cpu/latest/timeline.json docs/img/pp2-1f1b-gantt.png
    python benchmarks/bench_pipeline.py --layers 8 --rows 16 --micro 2 --timeline /tmp/tl.json
    python benchmarks/plot_pipeline_timeline.py /tmp/tl.json /tmp/gantt.png
"""

from __future__ import annotations

import argparse
import json


def run_actions(timeline: dict, step: int | None = None) -> dict[int, list]:
    """A run's ``timeline.json`` -> {pipeline rank: [(kind, chunk, micro, start, end, wait)]},
    seconds from the step's first action."""
    acts = timeline["pipeline_actions"]
    if not acts:
        raise SystemExit("timeline.json has no pipeline actions (no training unit at pp > 1)")
    step = max(a["step"] for a in acts) if step is None else step
    mine = [a for a in acts if a["step"] == step]
    t0 = min(a["start_s"] for a in mine)
    out: dict[int, list] = {}
    for a in mine:
        s, e = a["start_s"] - t0, a["end_s"] - t0
        row = (a["kind"], a["chunk"], a["micro"], s, e, a.get("wait_s", 0.0))
        out.setdefault(a["rank"], []).append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timeline")
    ap.add_argument("out")
    ap.add_argument("--title", default="pp=2, 1F1B: one training step (rpeg-tiny at 8 layers)")
    ap.add_argument("--step", type=int, help="a run's timeline.json: the step (default the last)")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.timeline) as f:
        data = json.load(f)
    tl = run_actions(data, args.step) if "pipeline_actions" in data else data
    tl = {int(r): acts for r, acts in tl.items()}
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.8 * len(tl)))
    colors = {"F": "#4c8bd6", "B": "#e0874a"}
    end = 0.0
    for r, acts in sorted(tl.items()):
        busy = 0.0
        for kind, _chunk, micro, s, e, wait in acts:
            y = len(tl) - 1 - r
            if wait > 0:
                ax.barh(y, wait, left=s, color="white", edgecolor="grey", hatch="//", height=0.6)
            ax.barh(
                y,
                e - s - wait,
                left=s + wait,
                color=colors[kind],
                height=0.6,
                edgecolor="black",
                linewidth=0.5,
            )
            ax.text(
                s + wait + (e - s - wait) / 2,
                y,
                f"{kind}{micro}",
                ha="center",
                va="center",
                fontsize=8,
                color="white",
            )
            busy += e - s - wait
            end = max(end, e)
        span = max(a[4] for a in acts) - min(a[3] for a in acts)
        ax.text(
            1.005,
            (len(tl) - 1 - r) / max(1, len(tl) - 1) if len(tl) > 1 else 0.5,
            f"idle {1 - busy / span:.0%}",
            transform=ax.get_yaxis_transform(),
            va="center",
            fontsize=8,
        )
    ax.set_yticks(range(len(tl)), [f"rank {r}" for r in sorted(tl, reverse=True)])
    ax.set_xlabel("seconds from the step's first action")
    ax.set_xlim(0, end * 1.01)
    ax.set_title(args.title, fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="grey", hatch="//"))
    ax.legend(
        handles,
        ["forward", "backward", "waiting on a receive"],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35),
        ncol=3,
        frameon=False,
    )
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
