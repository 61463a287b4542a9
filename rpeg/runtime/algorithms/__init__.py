"""RL algorithms as pure tensor functions (advantages, policy/value/KL/entropy losses, the
rollout/trainer mismatch and its corrections, policy-version lags)."""

from rpeg.runtime.algorithms.advantages import (
    gae_advantages,
    grpo_advantages,
    masked_mean,
    masked_whiten,
    outcome_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rpeg.runtime.algorithms.lags import (
    StaleSampleError,
    check_minibatch,
    lag_metrics,
    version_lags,
)
from rpeg.runtime.algorithms.losses import (
    aggregate,
    chunked_token_logprobs,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    token_logprobs,
    value_loss,
)
from rpeg.runtime.algorithms.mismatch import (
    add_sums,
    correction_weights,
    mismatch_from_sums,
    mismatch_metrics,
    mismatch_sums,
)

__all__ = [
    "StaleSampleError",
    "add_sums",
    "aggregate",
    "check_minibatch",
    "chunked_token_logprobs",
    "correction_weights",
    "entropy_from_logits",
    "gae_advantages",
    "grpo_advantages",
    "kl_penalty",
    "lag_metrics",
    "masked_mean",
    "masked_whiten",
    "mismatch_from_sums",
    "mismatch_metrics",
    "mismatch_sums",
    "outcome_token_rewards",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "token_logprobs",
    "value_loss",
    "version_lags",
]
