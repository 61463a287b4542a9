"""How RPEG's own runtime executes a forward or training unit on CPU "devices" (pure).

A CPU device is a one-thread worker process running eager PyTorch (``runtime.torch_threads``
1). Two facts of that runtime change what a unit costs, and are priced where the cluster's
device is ``cpu`` (:func:`rpeg.perf.passes.pass_cost`); docs/calibration.md, "Calibration from
a run":

* a packed unit (``UnitPlan.packs``, docs/packing.md) cuts each of the
  ``train_minibatches`` optimizer steps into micro-batches of at most ``mbs x max_seq`` real
  tokens and computes only those: ``ceil(tokens / budget)`` micro-batches, no padding;
* an unpacked one cuts them by sample count (``rpeg.runtime.micro_batches``): a rank runs
  ``minibatches x ceil(rows / mbs)`` micro-batches, each paying the eager per-layer cost,
  and pads each to its longest row (``RolloutBatch.select`` trims it there): every row
  computes the micro-batch's longest response, the expected longest of its rows under the
  step's length spread (:meth:`rpeg.perf.lengths.LengthDist.expected_max`). One response at
  the cap in 64 rows of ~3 tokens makes a forward compute 2.4x its tokens;
* decoder layers are checkpointed where the plan asks for recompute
  (rpeg.runtime.unit_memory), as on a GPU: four passes instead of three;
* gradients, FSDP shards and tensor-parallel activations of an fp32 run move as fp32 (4
  bytes a value) over gloo, not the 2 bytes of a bf16 GPU run (:func:`comm_value_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: the device name of a CPU cluster's one-thread worker processes (rpeg/specs/data/gpus.yaml)
CPU_DEVICE = "cpu"


def is_cpu(gpu: Any) -> bool:
    """Whether ``gpu`` (a GPUSpec) is a CPU worker process of RPEG's runtime."""
    return getattr(gpu, "name", "") == CPU_DEVICE


@dataclass(frozen=True)
class MicroBatches:
    """One rank's micro-batches of a unit: how many, the tokens of one as computed (padded
    rows), and ``padding``: computed over real tokens (1: no padding)."""

    count: float
    tokens: float
    padding: float = 1.0


def micro_batches(c: Any, dp: int, mbs: int, train: bool, packed: bool = False) -> MicroBatches:
    """The runtime's micro-batches on one rank of a ``dp``-way group (``c``: the
    :class:`rpeg.perf.units.UnitContext`): the step's ``c.N`` samples split over the dp
    ranks, in ``train_minibatches`` optimizer steps when training (one pass otherwise).
    ``packed``: each cut into ``ceil(tokens / (mbs x c.max_seq))`` micro-batches of real
    tokens. Else into ``ceil(rows / mbs)`` micro-batches of at most ``mbs`` rows, every row
    padded to the micro-batch's longest response (``c.lengths``: its expected longest of that
    many rows) after the mean prompt (``c.P``: prompts are priced without spread)."""
    real = c.P + c.R
    steps = c.wl.train_minibatches if train else 1
    if packed:
        return packed_split(c.N, real, dp, mbs * c.max_seq, steps)
    mb = split(c.N, real, dp, mbs, steps)
    rows = mb.tokens / real if real > 0 else 0.0
    if rows < 1:
        return mb
    padded = c.P + max(c.R, c.lengths.expected_max(round(rows)))
    return MicroBatches(mb.count, rows * padded, padded / real)


def split(samples: int, tokens_per_sample: float, dp: int, mbs: int, steps: int) -> MicroBatches:
    """:func:`micro_batches` in numbers: ``steps`` optimizer steps (1: a forward pass)."""
    steps = max(1, steps)
    rows = samples / max(1, dp) / steps  # rows of one rank per optimizer step (or pass)
    per_step = max(1, math.ceil(rows / max(1, mbs) - 1e-9))
    return MicroBatches(count=float(steps * per_step), tokens=rows / per_step * tokens_per_sample)


def packed_split(
    samples: int, tokens_per_sample: float, dp: int, budget: float, steps: int
) -> MicroBatches:
    """Packed micro-batches in numbers: one rank's rows of each of ``steps`` optimizer steps
    cut into micro-batches of at most ``budget`` real tokens."""
    steps = max(1, steps)
    tokens = samples / max(1, dp) / steps * tokens_per_sample
    per_step = max(1, math.ceil(tokens / max(1.0, budget) - 1e-9))
    return MicroBatches(count=float(steps * per_step), tokens=tokens / per_step)


def comm_value_bytes(precision: str) -> float:
    """Bytes a gradient / gathered parameter / activation value takes on the wire: fp32
    runs reduce fp32 (4 B), mixed-precision runs their 16-bit copies (2 B)."""
    return 4.0 if precision == "fp32" else 2.0


def scaled(gpu: Any, work_s: float, comm_s: float, scale: float) -> float:
    """A unit's time from its modelled work, its collectives and the fitted efficiency
    scale of its class (:class:`rpeg.perf.calibration.Calibration`, ``*_eff_scale``). On
    CPU workers the scale is the achieved share of the modelled eager compute and the
    collectives run over gloo at the link's own measured rate (``clusters.yaml``), so only
    the work is scaled: ``work / scale + comm``; elsewhere ``(work + comm) / scale`` (the
    systems' factors were fitted on published runs that way, rpeg.perf.systems)."""
    if is_cpu(gpu):
        return work_s / scale + comm_s
    return (work_s + comm_s) / scale


def overlap(gpu: Any, t_comp: float, fsdp_s: float, comm: dict[str, float], level: str) -> float:
    """The compute time of a pass whose FSDP gathers and reduce-scatters take ``fsdp_s``:
    hidden under the compute on accelerators (``max``: prefetched on their own streams);
    on CPU workers the one-thread rank waits for each gloo collective, so they are added
    to the unit's collectives at ``level`` (``comm``, updated) and the compute is
    unchanged."""
    if not is_cpu(gpu):
        return max(t_comp, fsdp_s)
    comm[level] = comm.get(level, 0.0) + fsdp_s
    return t_comp
