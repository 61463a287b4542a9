"""How a published step time was measured: per step, or a whole run's hours over its steps (pure).

Most reports give the mean time of a training step. Some give only a run's wall-clock hours
and its number of steps (``measured_other``: ``training_hours=H; ppo_steps=N``): that
"step" also carries what the run did between steps (evaluation, checkpoints, start-up),
which the model's step does not price. The share of a run's time outside its steps is
measured on rows that publish both the mean step and the run's total time
(``total_<N>_steps=<d>d<h>h<m>m``): ``total / (N x step) - 1``. ``rpeg validate`` fits it
like every other quantity leave-one-source-out (the median over the other sources' rows)
and compares an hours-derived row with ``predicted step x (1 + share)``.
"""

from __future__ import annotations

import re
import statistics

_TOTAL = re.compile(r"total_(\d+)_steps\s*=\s*(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?")


def _other(r: dict[str, str]) -> str:
    return r.get("measured_other") or ""


def from_hours(r: dict[str, str]) -> bool:
    """Whether the row's step time is a run's hours divided by its steps."""
    o = _other(r)
    return "training_hours=" in o and "ppo_steps=" in o


def outside_share(r: dict[str, str], step_s: float | None) -> float | None:
    """``total / (N x step) - 1`` where the row publishes its mean step and its total time
    for N steps; None otherwise."""
    m = _TOTAL.search(_other(r))
    if not m or not step_s or not any(m.group(i) for i in (2, 3, 4)):
        return None
    days, hours, mins = (int(m.group(i) or 0) for i in (2, 3, 4))
    total = 86400 * days + 3600 * hours + 60 * mins
    return total / (int(m.group(1)) * step_s) - 1.0


def fitted_share(shares: list[float]) -> float:
    """The run's share outside its steps from the measured ones: their median, at least 0
    (0 when none is published)."""
    return max(0.0, statistics.median(shares)) if shares else 0.0
