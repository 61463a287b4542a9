"""Training that trains nothing, found and named (issue 28: GRPO with ``temperature: 0``
trained on all-zero advantages, and a reward of 1e308 skipped every update, both with exit 0
and no word).

A step is **degenerate** when its metrics say no update can move the policy:

* every advantage is zero (``advantage_abs_mean == 0``: e.g. a group's samples all alike at
  temperature 0, or rewards that never differ),
* a reward is not finite or beyond :data:`HUGE_REWARD` (``reward_mean``/``reward_std``),
* every optimizer update was skipped (``skipped_update_frac == 1``: non-finite gradients).

:class:`DegenerateWatch` warns on each such step (naming why) and, after
``runtime.degenerate_steps_limit`` consecutive ones, raises :class:`DegenerateTraining`
(0: warn only). Both runtimes feed it every finished step's metrics.

All-zero advantages count toward the stop only when sampling is greedy (``temperature: 0``):
then every group's samples are alike and stay so, nothing can ever be learned. At a positive
temperature the samples still vary, and a model that earns no reward yet (a hard task, an
untrained or random-weights model) may find one in a later step: verl and TRL go on training
there, and so does RPEG, warning each step.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

from rpeg.errors import RpegError

#: a reward whose magnitude is beyond this makes advantages and losses overflow in fp32
HUGE_REWARD = 1e30


class DegenerateTraining(RpegError):
    """Too many consecutive steps in which nothing could be learned."""


def why_degenerate(m: Mapping[str, float]) -> str | None:
    """Why the step of metrics ``m`` cannot move the policy, or None."""
    for key in ("reward_mean", "reward_std"):
        v = m.get(key)
        if v is not None and (not math.isfinite(v) or abs(v) > HUGE_REWARD):
            return f"{key} is {v!r} (rewards must be finite and below {HUGE_REWARD:g})"
    if m.get("skipped_update_frac", 0.0) >= 1.0:
        return "every optimizer update was skipped (non-finite gradient norms)"
    adv = m.get("advantage_abs_mean")
    if adv is not None and adv == 0.0:
        return (
            "every advantage is 0 (each group's rewards are all equal: e.g. temperature 0 "
            "with GRPO, or a reward that never varies)"
        )
    return None


class DegenerateWatch:
    """Consecutive degenerate steps; ``limit`` (0: never stop) of them raise. ``greedy``:
    sampling at temperature 0, where all-zero advantages count toward the limit (module
    doc); otherwise they are warned about and neither count nor reset the count."""

    def __init__(self, limit: int, *, greedy: bool = False):
        self.limit = int(limit)
        self.greedy = bool(greedy)
        self.run = 0

    def check(self, step: int, m: Mapping[str, float]) -> None:
        why = why_degenerate(m)
        if why is None:
            self.run = 0
            return
        if not self.greedy and why.startswith("every advantage is 0"):
            warnings.warn(
                f"step {step}: nothing to learn: {why}; sampling varies at a positive "
                "temperature, so training goes on",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        self.run += 1
        msg = f"step {step}: nothing to learn: {why} ({self.run} step(s) in a row)"
        if self.limit and self.run >= self.limit:
            raise DegenerateTraining(
                f"{msg}; stopped after runtime.degenerate_steps_limit = {self.limit} such "
                "steps (raise it, or 0 to only warn)"
            )
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
