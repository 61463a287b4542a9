"""The timeline schema shared by the performance model (predicted) and the runtime
(measured), so that both can be laid side by side."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class TimelineRecord:
    """One execution unit's busy interval within one RL step.

    ``device_group`` is a compact device range (``"0-7"``) or a name; ``start_s``/``end_s``
    are seconds from the start of the step; ``source`` is ``predicted`` or ``measured``.
    """

    stage: str
    device_group: str
    start_s: float
    end_s: float
    step: int = 0
    kind: str = ""
    source: str = "predicted"

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimelineRecord:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def gantt(records: list[TimelineRecord], path: str, *, title: str = "") -> None:
    """Draw ``records`` as a Gantt chart to ``path`` (.png/.svg). Imports matplotlib lazily."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(r.device_group for r in records))
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * len(groups)))
    colors = plt.get_cmap("tab10")
    kinds = list(dict.fromkeys(r.kind or r.stage for r in records))
    for r in records:
        y = groups.index(r.device_group)
        c = colors(kinds.index(r.kind or r.stage) % 10)
        ax.barh(y, r.duration_s, left=r.start_s, color=c, edgecolor="black", height=0.6)
        if r.duration_s > 0:
            ax.text(r.start_s + r.duration_s / 2, y, r.stage, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(groups)), [f"devices {g}" for g in groups])
    ax.set_xlabel("seconds in step")
    ax.invert_yaxis()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
