"""Inputs and outputs of the performance model: the workload of one RL step, the cost of one
execution unit, and the prediction for the step (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rpeg.perf.timeline import TimelineRecord
from rpeg.perf.turns import Turns

GB = 1e9


# --- inputs -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """What one RL step processes (built from :class:`rpeg.config.WorkloadConfig`)."""

    num_prompts: int
    samples_per_prompt: int
    mean_prompt_tokens: float
    max_response_tokens: int
    mean_response_tokens: float | None = None
    # optimizer steps per RL step: the config's workload.train_minibatches (required: the
    # perf model prices the micro-batch size each unit's plan gives, UnitPlan.micro_batch_size)
    train_minibatches: int = field(kw_only=True)
    precision: str = "bf16"
    max_prompt_tokens: int | None = None
    max_seq_tokens: int | None = None  # packing budget; None = prompt cap + response cap
    # what the policy was trained to emit (base/instruct/reasoning) when it differs from the
    # catalog model's ``kind`` (a base checkpoint of a reasoning family): picks the
    # response-length prior; None = the model's own kind
    response_kind: str | None = None
    # what the prompts ask for where a run says so ("code": programs, whose reasoning traces
    # run longer than math ones; "math"): scales the response-length prior of a reasoning
    # model (rpeg.perf.lengths.prior_mean); None = not stated
    task_domain: str | None = None
    # LM image tokens per sample for a model with a vision tower; None = the model's prior
    image_tokens: float | None = None
    # LoRA (model.lora): the adapters' rank and target modules; None = full fine-tuning
    # (rpeg.perf.lora: the trainer holds gradients and optimizer state of the adapters only)
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] = ()
    # multi-turn rollouts (task.multiturn with an env): priced turn by turn (rpeg.perf.turns);
    # None = single turn
    turns: Turns | None = None
    # sigma of the lognormal response lengths where a run measured it (rpeg.perf.calibration.run_lengths);
    # None = the calibration's length_sigma
    length_sigma: float | None = None
    # what the workload's lengths rest on beyond the config (listed with the prediction's
    # assumptions): "lengths measured by rpeg calibrate on RUN" (rpeg.perf.calibration.run_lengths)
    assumed: tuple[str, ...] = ()
    # the trainers' optimizer state and update on the host (CPU offload of the optimizer:
    # DeepSpeed ZeRO-Offload, Megatron's CPU optimizer): no device bytes, the gradients down
    # and the parameters up over the host link and a CPU Adam per optimizer step. Assumed by
    # the row solver (rpeg.perf.validation.solve.solve_row) for a published run no layout fits without
    assumed_optimizer_on_host: bool = False
    # speculative decoding in the rollout engine: draft tokens proposed per decode step
    # (MTP heads, an EAGLE draft head; 0 = none) and the mean tokens a verification step
    # advances a sequence by (accepted drafts + the bonus token); None = the prior
    # (rpeg.perf.generation.spec_accept_len). docs/perf-model.md, "Equations"
    spec_draft_tokens: int = 0
    spec_accept_len: float | None = None
    # a draft tree (SGLang's EAGLE worker): tokens per sequence a verification runs
    # (``speculative_num_draft_tokens``; None = the chain's 1 + k) and candidates per
    # sequence each draft pass runs (``speculative_eagle_topk``; 1 = a chain)
    spec_verify_tokens: int | None = None
    spec_topk: int = 1
    # the rollout engine's cap on sequences in flight per replica where the run sets one
    # (vLLM ``max_num_seqs``, SGLang ``max_running_requests``); None = Calibration.max_num_seqs
    gen_max_seqs: int | None = None
    # an engine without continuous batching (DeepSpeed-Chat's hybrid engine, HF ``generate``):
    # sequences per generation batch of a replica; each batch decodes until its longest
    # response ends, finished sequences still computed. None = continuous batching (vLLM,
    # SGLang, TensorRT-LLM)
    gen_static_batch: int | None = None

    @classmethod
    def from_config(cls, w: Any, lora: Any = None, multiturn: Any = None) -> Workload:
        """``w``: a WorkloadConfig; ``lora``: the run's model.lora section (or None);
        ``multiturn``: the run's task.multiturn (single turn when its ``env`` is None)."""
        return cls(
            turns=turns_from_config(multiturn),
            lora_rank=None if lora is None else lora.rank,
            lora_targets=() if lora is None else tuple(lora.target_modules),
            num_prompts=w.num_prompts,
            samples_per_prompt=w.samples_per_prompt,
            mean_prompt_tokens=float(w.mean_prompt_tokens or w.max_prompt_tokens),
            max_prompt_tokens=w.max_prompt_tokens,
            max_response_tokens=w.max_response_tokens,
            mean_response_tokens=w.mean_response_tokens,
            train_minibatches=w.train_minibatches,
            precision=w.precision,
        )

    @property
    def samples(self) -> int:
        return self.num_prompts * self.samples_per_prompt

    @property
    def max_seq(self) -> int:
        """Tokens of the longest sequence: the packing budget per packed micro-batch row
        (``max_seq_tokens``, else the prompt cap, or the mean prompt, plus the response
        cap; rpeg.perf.units.UnitContext's ``max_seq`` also counts a vision tower's image
        tokens in the mean prompt)."""
        if self.max_seq_tokens:
            return self.max_seq_tokens
        return int((self.max_prompt_tokens or self.mean_prompt_tokens) + self.max_response_tokens)


def turns_from_config(mt: Any) -> Turns | None:
    """The :class:`Turns` of a task.multiturn section (None: no environment, one turn)."""
    if mt is None or not mt.env:
        return None
    return Turns(
        max_turns=mt.max_turns,
        max_turn_tokens=mt.max_turn_tokens,
        env_concurrency=mt.env_concurrency,
        mean_turns=mt.mean_turns,
        mean_turn_tokens=mt.mean_turn_tokens,
        observation_tokens=mt.observation_tokens,
        env_latency_s=mt.env_latency_s,
    )


# --- outputs ----------------------------------------------------------------------------
@dataclass
class StageCost:
    """Predicted cost of one execution unit in one RL step."""

    name: str
    kinds: tuple[str, ...]
    devices: str
    num_devices: int
    time_s: float = 0.0
    flops: float = 0.0
    hbm_bytes: float = 0.0
    comm_s: dict[str, float] = field(default_factory=dict)  # by link level
    memory_gb: dict[str, float] = field(default_factory=dict)  # per-device breakdown
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def peak_memory_gb(self) -> float:
        return sum(self.memory_gb.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kinds": list(self.kinds),
            "devices": self.devices,
            "num_devices": self.num_devices,
            "time_s": self.time_s,
            "flops": self.flops,
            "hbm_bytes": self.hbm_bytes,
            "comm_s": dict(self.comm_s),
            "peak_memory_gb": self.peak_memory_gb,
            "memory_gb": dict(self.memory_gb),
            "detail": dict(self.detail),
        }


@dataclass
class StepPrediction:
    step_s: float
    stages: dict[str, StageCost]
    num_devices: int
    tokens_per_step: float
    tokens_per_s_per_gpu: float
    mfu: float
    timeline: list[TimelineRecord]
    device_memory_gb: dict[str, float]  # peak per device group (co-resident units)
    capacity_gb: float
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_s": self.step_s,
            "num_devices": self.num_devices,
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "capacity_gb": self.capacity_gb,
            "device_memory_gb": dict(self.device_memory_gb),
            "stages": {k: v.to_dict() for k, v in self.stages.items()},
            "timeline": [r.to_dict() for r in self.timeline],
            "assumptions": list(self.assumptions),
        }
