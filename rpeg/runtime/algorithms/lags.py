"""Policy-version lag of the samples an optimizer update trains on: checked per mini-batch,
counted per step. Pure tensor functions (with a :class:`RankReduce` for data parallelism).

The rule (docs/engine.md "Staleness"): policy version ``v`` = RL steps the actor has
trained (one publication of weights per step). A step trains at version ``v``: its ``U =
ppo_epochs x train_minibatches`` optimizer updates all start from the weights of version
``v`` (the proximal policy whose old log-probs the PPO ratio and the clip are taken
against), and the version advances by one when the step's last update is done. A sample
generated at version ``g`` has the **version lag** ``v - g``; before every update the lag
of each row of the mini-batch is checked to be in ``[0, k]`` (``k`` =
``runtime.max_staleness`` or the plan's), over the whole data-parallel group, and a row
outside stops the step with :class:`StaleSampleError` before anything is trained on it.
The **update lag** of a row at update ``u`` (0-based within the step) counts the optimizer
updates between the weights that sampled it and the weights the gradient is taken at:
``(v - g) * U + u``; it grows within a step and is bounded by ``(k + 1) * U - 1``.
"""

from __future__ import annotations

import torch

from rpeg.errors import RpegError
from rpeg.runtime.parallel import LOCAL, RankReduce

#: metrics of a step's lags; plus ``staleness_lag_<i>`` (rows at version lag ``i``, 0..k)
LAG_KEYS = ("staleness_lag_mean", "staleness_lag_max", "staleness_update_lag_max")


class StaleSampleError(RpegError):
    """A mini-batch holds a row whose policy-version lag is outside ``[0, k]``."""


def version_lags(trainer_version: int, sample_versions: torch.Tensor) -> torch.Tensor:
    """``[b]`` long: ``trainer_version - sample_versions``."""
    return trainer_version - sample_versions.to(torch.long)


def check_minibatch(
    lags: torch.Tensor | None,
    k: int | None,
    *,
    update: int,
    updates_per_step: int,
    reduce: RankReduce = LOCAL,
) -> int:
    """Check one mini-batch's rows before optimizer update ``update`` of the step: every
    version lag in ``[0, k]`` over the group (``lags`` None or empty: this rank holds no
    row of it; ``k`` None: no bound). A collective when ``reduce`` spans ranks (every rank
    calls it for every update, so all raise together). Returns the mini-batch's largest
    update lag ``max_lag * updates_per_step + update`` (-1 when no rank holds a row)."""
    if lags is None or lags.numel() == 0:
        here = torch.tensor([-1, -1], dtype=torch.long)
    else:
        here = torch.stack([lags.max(), -lags.min()]).to(torch.long)
    top, neg = (int(x) for x in reduce.max(here))
    if top < 0:
        return -1
    if neg > 0:
        raise StaleSampleError(
            f"optimizer update {update}: a row was generated {neg} version(s) after the "
            "policy being trained (a sample's policy_version is ahead of the trainer's)"
        )
    if k is not None and top > k:
        raise StaleSampleError(
            f"optimizer update {update}: a row lags the trained policy by {top} versions, "
            f"more than max_staleness k={k}; nothing was trained on it"
        )
    return top * updates_per_step + update


def lag_metrics(
    lags: torch.Tensor,
    k: int | None,
    *,
    update_lag_max: int,
    reduce: RankReduce = LOCAL,
) -> dict[str, float]:
    """A step's lag histogram over its rows (each row once, all ranks of the group):
    ``staleness_lag_<i>`` = rows at version lag ``i`` for ``i`` = 0..k (0..the largest lag
    when ``k`` is None), ``staleness_lag_mean``, ``staleness_lag_max`` and
    ``staleness_update_lag_max`` (``update_lag_max``: the step's largest from
    :func:`check_minibatch`)."""
    here_max = lags.max().reshape(1) if lags.numel() else torch.zeros(1, dtype=torch.long)
    top = int(reduce.max(here_max.to(torch.long))[0])
    size = (top if k is None else max(k, top)) + 1
    counts = torch.bincount(lags.clamp(min=0).to(torch.long), minlength=size)[:size]
    counts = reduce.sum(counts.to(torch.float64))
    rows = float(counts.sum())
    out = {f"staleness_lag_{i}": float(c) for i, c in enumerate(counts.tolist())}
    mean = float((counts * torch.arange(size, dtype=torch.float64)).sum()) / max(rows, 1.0)
    out.update(
        staleness_lag_mean=mean,
        staleness_lag_max=float(top),
        staleness_update_lag_max=float(max(update_lag_max, 0)),
    )
    return out
