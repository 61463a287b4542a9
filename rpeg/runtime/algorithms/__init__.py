"""RL algorithms as pure tensor functions (advantages, policy/value/KL/entropy losses)."""

from rpeg.runtime.algorithms.advantages import (
    gae_advantages,
    grpo_advantages,
    masked_mean,
    masked_whiten,
    outcome_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
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

__all__ = [
    "aggregate",
    "chunked_token_logprobs",
    "entropy_from_logits",
    "gae_advantages",
    "grpo_advantages",
    "kl_penalty",
    "masked_mean",
    "masked_whiten",
    "outcome_token_rewards",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "token_logprobs",
    "value_loss",
]
