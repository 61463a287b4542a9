"""The shape of a multi-turn rollout and its per-turn arithmetic (pure; docs/multiturn.md
"Pricing"). The pricing that uses it is :mod:`rpeg.perf.turn_pricing`.

A sample alternates the model's turns and the environment's steps: turn 1 generates from the
prompt; before each later turn the environment answers with observation tokens that are
appended to the transcript. Samples that finish early drop out: with a mean of ``T`` turns
the share of samples still alive at turn ``i`` (0-based) is ``min(1, T - i)`` (every sample
takes ``floor(T)`` turns, a share ``T - floor(T)`` one more). What each turn costs:

- generation of the turn's tokens (a decode from the prefix so far);
- the prefill of the prefix: the whole prefix again when the engine keeps no KV across turns
  (RPEG's torch engine re-prefills every turn), or only the new observation tokens when it
  reuses the prefix's KV (vLLM's automatic prefix caching);
- the environment's calls, ``env_latency_s`` each, at most ``env_concurrency`` at once per
  rollout process, as RPEG's rollout makes them: a reset per sample before turn 1, and a
  step per sample after each of its turns (a tool call's result, or the final answer's
  score); ``ceil(n / c) * latency`` per wave of ``n`` calls (the rollout waits for every
  row's call before the next turn's batched generate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rpeg import defaults
from rpeg.perf.lengths import prior_mean

#: engines that keep the prefix's KV cache across requests (prefix caching)
KV_REUSE_ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class Turns:
    """The multi-turn inputs of the performance model (from ``task.multiturn``).

    ``mean_turns`` None: priced at ``max_turns`` (stated as an assumption);
    ``mean_turn_tokens`` None: the length prior of the model's kind at the per-turn cap;
    ``kv_reuse`` None: by the generation unit's engine (:func:`reuses_kv`)."""

    max_turns: int
    max_turn_tokens: int
    env_concurrency: int  # environment calls at once per rollout process
    mean_turns: float | None = None
    mean_turn_tokens: float | None = None
    observation_tokens: float = defaults.MEAN_OBSERVATION_TOKENS
    env_latency_s: float = defaults.ENV_LATENCY_S
    kv_reuse: bool | None = None

    def __post_init__(self) -> None:
        bad = []
        if self.max_turns < 1:
            bad.append(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_turn_tokens < 1:
            bad.append(f"max_turn_tokens must be >= 1, got {self.max_turn_tokens}")
        if self.mean_turns is not None and not 1.0 <= self.mean_turns <= self.max_turns:
            bad.append(
                f"mean_turns must be in [1, max_turns={self.max_turns}], got {self.mean_turns}"
            )
        if (
            self.mean_turn_tokens is not None
            and not 0 < self.mean_turn_tokens <= self.max_turn_tokens
        ):
            bad.append(
                f"mean_turn_tokens must be in (0, max_turn_tokens={self.max_turn_tokens}], "
                f"got {self.mean_turn_tokens}"
            )
        if self.observation_tokens < 0:
            bad.append(f"observation_tokens must be >= 0, got {self.observation_tokens}")
        if self.env_latency_s < 0:
            bad.append(f"env_latency_s must be >= 0, got {self.env_latency_s}")
        if self.env_concurrency < 1:
            bad.append(f"env_concurrency must be >= 1, got {self.env_concurrency}")
        if bad:
            raise ValueError("Turns: " + "; ".join(bad))

    @property
    def turns(self) -> float:
        """Mean model turns per sample (``max_turns`` when unstated)."""
        return float(self.max_turns if self.mean_turns is None else self.mean_turns)


def mean_turn_tokens(t: Turns, kind: str, calib: object) -> float:
    """Generated tokens per turn: the stated mean, else the response-length prior of the
    model's ``kind`` at the per-turn cap (:func:`rpeg.perf.lengths.prior_mean`)."""
    if t.mean_turn_tokens is not None:
        return float(t.mean_turn_tokens)
    return prior_mean(kind, float(t.max_turn_tokens), calib)


def assumptions(t: Turns, kind: str, calib: object) -> list[str]:
    """What the pricing assumed where the inputs do not say (a prediction's assumptions)."""
    out = [
        f"multi-turn: environment latency {t.env_latency_s:g} s per call, "
        f"{t.observation_tokens:g} observation tokens per step, {t.env_concurrency} calls at once"
    ]
    if t.mean_turns is None:
        out.append(f"turns per sample unstated: priced at max_turns={t.max_turns}")
    if t.mean_turn_tokens is None:
        g = mean_turn_tokens(t, kind, calib)
        out.append(
            f"tokens per turn unstated: assumed {g:.0f} (prior of {kind} models at a "
            f"{t.max_turn_tokens}-token turn cap)"
        )
    return out


def turn_shares(turns: float) -> list[float]:
    """The share of samples alive at each turn (0-based): ``min(1, turns - i)``; they sum
    to ``turns``."""
    return [min(1.0, turns - i) for i in range(math.ceil(turns - 1e-9))]


def prefix_tokens(prompt: float, turn: int, gen: float, obs: float) -> float:
    """Tokens before turn ``turn`` (0-based): the prompt, ``turn`` generated turns and
    ``turn`` observations."""
    return prompt + turn * (gen + obs)


def prefill_tokens(prompt: float, turns: float, gen: float, obs: float, kv_reuse: bool) -> float:
    """Prefill tokens per sample over its turns: the whole prefix at every turn without KV
    reuse, the prompt once and then each observation with it."""
    shares = turn_shares(turns)
    if kv_reuse:
        return prompt + sum(shares[1:]) * obs
    return sum(s * prefix_tokens(prompt, i, gen, obs) for i, s in enumerate(shares))


def transcript_tokens(turns: float, gen: float, obs: float) -> float:
    """Mean tokens after the prompt: generated turns and the observations between them."""
    shares = turn_shares(turns)
    return sum(shares) * gen + sum(shares[1:]) * obs


def transcript_mean(t: Turns, kind: str, calib: object, cap: float) -> float:
    """A sample's mean tokens after the prompt (what the trainer's passes see), at most the
    response cap ``cap``."""
    g = mean_turn_tokens(t, kind, calib)
    return min(cap, transcript_tokens(t.turns, g, t.observation_tokens))


def env_calls(turns: float) -> float:
    """Environment calls per sample: the reset, then a step after each of its turns."""
    return 1.0 + sum(turn_shares(turns))


def env_waves(samples: float, turns: float, concurrency: int) -> float:
    """Waves of environment calls of one rollout process of ``samples`` samples, at most
    ``concurrency`` at once: the resets, then after turn ``i`` the steps of the samples
    alive at it, ``ceil(n / concurrency)`` each."""
    per = [1.0, *turn_shares(turns)]
    return float(sum(math.ceil(samples * s / concurrency - 1e-9) for s in per))


def env_seconds(samples: float, turns: float, latency_s: float, concurrency: int) -> float:
    """Wall time of one rollout process's environment calls: :func:`env_waves` of
    ``latency_s`` each."""
    return env_waves(samples, turns, concurrency) * latency_s


def reuses_kv(turns: Turns, engine: str, gpu_name: str) -> bool:
    """Whether generation keeps the prefix's KV across turns: the stated ``kv_reuse``, else
    by engine (vLLM/SGLang: prefix caching; torch: re-prefill); ``auto`` is vLLM on a GPU and
    the torch engine on the CPU profile (rpeg.runtime.engines.choice)."""
    if turns.kv_reuse is not None:
        return turns.kv_reuse
    if engine == "auto":
        return gpu_name != "cpu"
    return engine in KV_REUSE_ENGINES
