"""The RL algorithm's section (its name, KL, clipping, advantage and loss options, the
rollout/trainer mismatch correction) and the optimizer's. Each default written once, here."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rpeg import defaults
from rpeg.config.section import Section

AlgorithmName = Literal["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo"]  # rpeg.ir.recipes
KLEstimator = Literal["k1", "k2", "k3"]
LossAggregation = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]

RolloutCorrectionMode = Literal["none", "token_tis", "seq_tis", "token_mis", "seq_mis", "icepop"]

#: each rollout-correction mode's bounds ``(low, high)`` on the ratio ``pi_train / pi_rollout``
#: when the config leaves them unset (docs/engine.md "Rollout/trainer mismatch" gives the
#: sources): TIS truncates at 2 (verl's ``rollout_is_threshold`` default; Yao et al. 2025's
#: TIS cap), the masked modes keep ``[1/2, 2]`` (verl's rejection bounds: upper = the IS
#: threshold, lower = its reciprocal), IcePop keeps ``[0.5, 5]``. ``None``: no bound.
ROLLOUT_CORRECTION_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "none": (None, None),
    "token_tis": (None, 2.0),
    "seq_tis": (None, 2.0),
    "token_mis": (0.5, 2.0),
    "seq_mis": (0.5, 2.0),
    "icepop": (0.5, 5.0),
}


class RolloutCorrectionConfig(Section):
    """How the loss corrects for the gap between the rollout engine's log-probs and the
    trainer's (rpeg.runtime.algorithms.mismatch). The ratio is ``rho = pi_train /
    pi_rollout`` = ``exp(old - behaviour)`` per token (``old``: the trainer's log-probs at
    the weights before the step's update)."""

    mode: RolloutCorrectionMode = Field(
        "token_tis",
        description="none; token_tis: loss x min(rho_t, high); seq_tis: x min(prod_t rho_t, "
        "high); token_mis: x rho_t, tokens with rho_t outside [low, high] dropped; seq_mis: "
        "x prod rho, sequences whose product leaves [low, high] dropped; icepop: token_mis "
        "with IcePop's bounds",
    )
    low: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="lower ratio bound of the masked modes; None = the mode's default "
        "(ROLLOUT_CORRECTION_BOUNDS: 0.5)",
    )
    high: float | None = Field(
        None,
        ge=1.0,
        description="TIS cap / upper ratio bound of the masked modes; None = the mode's "
        "default (2.0; icepop 5.0)",
    )
    apply_to: Literal["stale", "all"] = Field(
        "stale",
        description="stale = correct a step's batch only when it holds samples of an older "
        "policy version (the engine's numerics alone are not corrected); all = every step",
    )
    measure: Literal["first_update", "forward"] = Field(
        "first_update",
        description="how the rollout/trainer mismatch (logprob_mismatch_*) is measured on "
        "steps that reuse the engine's log-probs as the old ones: first_update = on the rows "
        "of the step's first optimizer update, whose forward runs at the old weights (no extra "
        "forward; a random 1/train_minibatches of the rows); forward = recompute the old "
        "log-probs with a forward every step (every token). Steps that recompute anyway "
        "(stale rows, recompute_old_logprobs, apply_to=all) measure every token",
    )
    mismatch_threshold: float = Field(
        defaults.MISMATCH_THRESHOLD,
        gt=0.0,
        description="logprob_mismatch_frac_over counts tokens with |rho - 1| above this",
    )

    @model_validator(mode="after")
    def _bounds_for_mode(self) -> RolloutCorrectionConfig:
        if self.low is not None and self.mode in ("none", "token_tis", "seq_tis"):
            raise ValueError(
                f"low is a bound of the masked modes (token_mis, seq_mis, icepop); "
                f"mode {self.mode!r} does not use it"
            )
        return self

    def bounds(self) -> tuple[float | None, float | None]:
        """``(low, high)``: the configured bounds, else the mode's defaults."""
        low, high = ROLLOUT_CORRECTION_BOUNDS[self.mode]
        return (low if self.low is None else self.low), (high if self.high is None else self.high)


class AlgorithmConfig(Section):
    """The RL algorithm and its loss options (DAPO-style options are plain fields)."""

    name: AlgorithmName = "grpo"
    use_reference: bool = Field(True, description="keep a frozen reference model for a KL term")
    kl_coef: float = Field(
        defaults.KL_COEF,
        ge=0.0,
        description="weight of the KL penalty: in the loss or the reward, as the "
        "algorithm's recipe says (rpeg.ir.recipes; none for dapo)",
    )
    kl_estimator: KLEstimator = "k3"
    clip_low: float = Field(
        defaults.CLIP_LOW, gt=0.0, lt=1.0, description="PPO ratio clip: 1 - clip_low"
    )
    clip_high: float = Field(
        defaults.CLIP_HIGH,
        gt=0.0,
        description="PPO ratio clip: 1 + clip_high (DAPO clip-higher: 0.28)",
    )
    dual_clip: float | None = Field(
        None, gt=1.0, description="dual-clip bound c for negative advantages"
    )
    loss_aggregation: LossAggregation = "token_mean"
    normalize_advantage_std: bool = Field(
        True, description="GRPO: divide by group std (False = Dr.GRPO)"
    )
    entropy_coef: float = Field(defaults.ENTROPY_COEF, ge=0.0)
    gamma: float = Field(defaults.GAMMA, gt=0.0, le=1.0, description="PPO/GAE discount")
    gae_lambda: float = Field(defaults.GAE_LAMBDA, ge=0.0, le=1.0)
    value_clip: float | None = Field(defaults.VALUE_CLIP, gt=0.0)
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig,
        description="off-policy correction of the rollout engine's samples (TIS, masked IS, "
        "IcePop) and the mismatch measurement",
    )
    dynamic_sampling: bool = Field(
        False, description="DAPO: drop groups whose rewards are all equal"
    )
    overlong_penalty_tokens: int = Field(
        defaults.OVERLONG_PENALTY_TOKENS, ge=0, description="DAPO soft overlong punishment window"
    )
    share_actor_critic: bool = Field(
        False, description="PPO: value head on the actor's trunk (one forward)"
    )
    vf_coef: float = Field(
        0.5, ge=0.0, description="weight of the value loss when actor and critic share a trunk"
    )
    ppo_epochs: int = Field(1, ge=1, description="passes over the batch per RL step")
    recompute_old_logprobs: bool = Field(
        False,
        description="recompute old log-probs with a forward pass even for on-policy samples "
        "(stale samples always get them recomputed: decoupled PPO's proximal policy)",
    )
    routing_replay: Literal["off", "record", "rollout"] = Field(
        "off",
        description="mixture-of-experts routing (docs/models.md): off; record = the torch "
        "engine records each response token's experts and the training forward logs "
        "routing_mismatch (the share of (layer, token) pairs routed elsewhere than in the "
        "rollout); rollout = the same, and the log-prob and training forwards replay the "
        "rollout's experts on the response tokens (routing_mismatch 0). A model without "
        "routers, a vLLM engine (it returns no routes to rpeg: docs/vllm.md) or pp > 1 is "
        "refused",
    )

    @model_validator(mode="before")
    @classmethod
    def _replaced_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            old = [k for k in ("off_policy_correction", "tis_cap") if k in data]
            if old:
                raise ValueError(
                    f"{', '.join(old)} replaced by rollout_correction: "
                    "{mode: token_tis | seq_tis | token_mis | seq_mis | icepop | none, "
                    "high: <the old tis_cap>}"
                )
        return data


#: the largest learning rate accepted: Adam fine-tuning runs at 1e-7..1e-3; 1e30 trained a
#: collapsed model for 20 steps before the degenerate-training stop (issue 44)
MAX_LR = 10.0


class OptimConfig(Section):
    lr: float = Field(defaults.LR, gt=0.0, le=MAX_LR, description="at most 10")
    critic_lr: float = Field(1e-4, gt=0.0, le=MAX_LR)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float = Field(1.0, gt=0.0)
    warmup_sft_steps: int | None = Field(
        None,
        ge=0,
        description="supervised warm-up steps before RL (cached on disk). None = 150 for the "
        "built-in tiny model (random init; 150 leaves it at ~35% held-out accuracy) and 0 for a "
        "model loaded from model.path",
    )
    warmup_sft_lr: float = Field(1e-3, gt=0.0, le=MAX_LR)
    warmup_sft_batch_size: int = Field(64, ge=1, description="examples per warm-up step")
