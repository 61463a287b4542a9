"""The executing system of a run as an input of the performance model (pure).

The analytical model prices an ideal executor of a plan. Real RL systems reach a different
share of it, in a direction that depends on the system and its backends (a Python-driven
rollout loop, a training backend's achieved MFU, host work between stages). A system is
named by one of :data:`SYSTEMS` and carries two physically meaningful factors, each the
achieved share of the modelled rate (time = modelled time / factor):

* ``gen_eff``: the rollout engine as the system drives it (vLLM/SGLang version, server vs
  offline mode, how requests are batched and re-submitted);
* ``train_eff``: the training/forward backend's achieved MFU relative to the model's GEMM
  curve (FSDP vs Megatron-Core, kernels, dynamic batching, offload);

fitted on published step times (:mod:`rpeg.perf.validation.loso`, leave-one-source-out for every
figure the project quotes). RPEG's own runtime is the system ``rpeg``: its factors come
from ``rpeg calibrate RUN_DIR`` on the user's machine (rpeg.perf.calibration.fit), not from this table.
A system not in the table (or not stated) uses the pooled factors of all sources with the
wider range of the pooled residuals (:func:`system_params`).

Structural effects that are not an efficiency are priced by the model itself, not here
(e.g. MoE training without expert parallelism as a loop over experts, rpeg.perf.units).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from rpeg.perf.calibration import Calibration

#: Known systems: name -> what it is (the ``system`` column of a data set; ``--system``).
SYSTEMS: dict[str, str] = {
    "verl-fsdp": "verl with the FSDP/FSDP2 trainer (vLLM or SGLang rollout)",
    "verl-megatron": "verl with the Megatron-Core trainer",
    "nemo-rl-megatron": "NVIDIA NeMo-RL with the Megatron-Core trainer (vLLM rollout)",
    "nemo-rl-dtensor": "NVIDIA NeMo-RL with the DTensor (FSDP2) trainer",
    "openrlhf-deepspeed": "OpenRLHF with DeepSpeed ZeRO trainers (vLLM rollout)",
    "deepspeed-chat": "DeepSpeed-Chat (ZeRO trainers, generation in the hybrid engine)",
    "areal": "AReaL (ReaL/Megatron-style 3D trainer, SGLang rollout, asynchronous)",
    "slime-megatron": "slime (and its fork Miles): Megatron trainer, SGLang rollout",
    "skyrl": "SkyRL (FSDP trainer, vLLM rollout)",
    "trl": "Hugging Face TRL (GRPOTrainer; transformers generate unless use_vllm)",
    "nemo-aligner": "NVIDIA NeMo-Aligner (Megatron trainer; TensorRT-LLM generation in static batches)",
    "rpeg": "RPEG's own runtime (calibrated per machine by `rpeg calibrate`)",
}

#: name used when a run does not say which system executes it
POOLED = "pooled"


@dataclass(frozen=True)
class SystemParams:
    """Fitted factors of one system (see module doc) and the spread of its residuals."""

    name: str
    gen_eff: float = 1.0
    train_eff: float = 1.0
    # log-residual quantiles (q10, q90) of its rows scored leave-one-source-out: the range
    # a prediction for this system carries (conformal-style; rpeg.perf.validation.loso)
    resid_lo: float = -0.3
    resid_hi: float = 0.3
    sources: int = 0  # published sources the factors rest on
    rows: int = 0

    def calibration(self, base: Calibration) -> Calibration:
        """``base`` with this system's factors applied to every unit of its class and the
        response-length medians fitted on the published runs (rpeg.perf.validation.loso_lengths)."""
        med = _table().get("fitted_length_medians") or {}
        return replace(
            base,
            gen_eff_scale=base.gen_eff_scale * self.gen_eff,
            train_eff_scale=base.train_eff_scale * self.train_eff,
            fwd_eff_scale=base.fwd_eff_scale * self.train_eff,
            response_median_reasoning=float(med.get("reasoning", base.response_median_reasoning)),
            response_median_instruct=float(med.get("instruct", base.response_median_instruct)),
        )


def normalise(name: str) -> str:
    """Lower-case, spaces/underscores as dashes; '' stays ''."""
    return "-".join((name or "").strip().lower().replace("_", " ").split())


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    """``rpeg/perf/data/systems.yaml`` as read ({} when absent)."""
    import yaml

    path = resources.files("rpeg.perf").joinpath("data", "systems.yaml")
    try:
        data: Any = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


@lru_cache(maxsize=1)
def shipped() -> dict[str, SystemParams]:
    """The factors fitted on all shipped published runs (``rpeg/perf/data/systems.yaml``,
    written by ``python -m rpeg.perf.validation.systems_fit --write``), by system name, plus ``pooled``."""
    data = _table()
    out = {}
    for name, v in (data.get("systems") or {}).items():
        out[name] = SystemParams(name=name, **{k: v[k] for k in v if k != "name"})
    out.setdefault(POOLED, SystemParams(POOLED))
    return out


def system_params(name: str, table: dict[str, SystemParams] | None = None) -> SystemParams:
    """The factors of system ``name``; the pooled factors, with a range 1.5x as wide, for a
    system that is unknown or has no fitted rows."""
    table = shipped() if table is None else table
    key = normalise(name)
    if key in table and key != POOLED:
        return table[key]
    pooled = table[POOLED]
    return replace(
        pooled,
        name=key or POOLED,
        resid_lo=pooled.resid_lo * UNKNOWN_WIDEN,
        resid_hi=pooled.resid_hi * UNKNOWN_WIDEN,
    )


def widen(point: float, low: float, high: float, p: SystemParams) -> tuple[float, float]:
    """The wider of a range and the system's LOSO residual spread around ``point``."""
    import math

    return min(low, point * math.exp(p.resid_lo)), max(high, point * math.exp(p.resid_hi))


#: how much wider the range of a system with no fitted rows is than the pooled one
UNKNOWN_WIDEN = 1.5
