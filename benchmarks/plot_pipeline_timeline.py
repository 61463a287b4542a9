"""Draw the Gantt chart of one pipelined training step from the per-rank action timeline that
``python benchmarks/bench_pipeline.py --timeline T.json`` writes (each action: kind F/B, model
chunk, micro-batch, start, end, seconds waiting on its receive), one row per pipeline rank;
the wait of an action is drawn hatched, the gaps between actions are the idle (bubble) time.

    python benchmarks/bench_pipeline.py --layers 8 --rows 16 --micro 2 --timeline /tmp/tl.json
    python benchmarks/plot_pipeline_timeline.py /tmp/tl.json docs/img/pp2-1f1b-gantt.png
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timeline")
    ap.add_argument("out")
    ap.add_argument("--title", default="pp=2, 1F1B: one training step (rpeg-tiny at 8 layers)")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.timeline) as f:
        tl = {int(r): acts for r, acts in json.load(f).items()}
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
