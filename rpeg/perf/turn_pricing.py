"""Multi-turn rollouts priced turn by turn (pure): the generate stage of a workload with
:class:`rpeg.perf.turns.Turns` is one generation per turn, from the prefix so far, with the
samples still alive; the env stage is the environment's calls (the resets, a step after
each turn).
docs/multiturn.md "Pricing" has the equations."""

from __future__ import annotations

import copy

from rpeg.perf import turns as T
from rpeg.perf.generation import generation_cost, prefill_time
from rpeg.perf.lengths import LengthDist
from rpeg.perf.prediction import StageCost
from rpeg.perf.units import GEN_KIND, UnitContext
from rpeg.plan.schema import UnitPlan, format_devices

ENV_KIND = "env"


def _replicas(u: UnitPlan) -> int:
    return max(1, u.num_devices // (u.tp * u.pp))


def multiturn_generation_cost(
    c: UnitContext, u: UnitPlan, name: str, throughput_mode: bool
) -> StageCost:
    """The generate stage of a multi-turn rollout: turn ``i`` (0-based) generates
    ``turn_tokens`` on average from a prefix of ``P + i (g + o)`` tokens for the share
    ``min(1, T - i)`` of the samples still alive (:func:`rpeg.perf.generation.generation_cost`
    with that prompt, length distribution and sample count). With KV reuse a later turn
    prefills only its new observation tokens (attending to the whole prefix) instead of the
    whole prefix."""
    t = c.wl.turns
    assert t is not None
    g = T.mean_turn_tokens(t, c.wl.response_kind or c.model.kind, c.calib)
    o = t.observation_tokens
    reuse = T.reuses_kv(t, u.engine, c.gpu.name)
    sc = StageCost(name, (GEN_KIND,), format_devices(u.devices), u.num_devices)
    lengths = LengthDist(g, t.max_turn_tokens, c.calib.length_sigma)
    replicas = _replicas(u)
    scale = c.calib.gen_eff_scale
    per_turn = []
    for i, share in enumerate(T.turn_shares(t.turns)):
        ci = copy.copy(c)
        ci.N = c.N * share
        ci.P = T.prefix_tokens(c.P, i, g, o)
        ci.lengths = lengths
        ci.vision_fwd_flops = c.vision_fwd_flops * share if (i == 0 or not reuse) else 0.0
        part = generation_cost(ci, u, name, throughput_mode)
        time_s = part.time_s
        flops = part.flops
        if i > 0 and reuse:  # only the observation tokens are new: prefill them
            s_rep = ci.N / replicas
            full = ci.P
            sq = s_rep * (full * full - (full - o) ** 2)
            t_new, f_new = prefill_time(ci, u, s_rep * o, sq)
            time_s += (t_new - part.detail["prefill_s"]) / scale
            flops += (f_new - part.detail.get("prefill_flops", 0.0)) * u.num_devices
        if i > 0 and "reprefill_s" in part.detail:
            # an asynchronous engine's interruption at the weight update happens once a step
            time_s -= part.detail["reprefill_s"] / scale
        per_turn.append(time_s)
        sc.time_s += time_s
        sc.flops += flops
        sc.hbm_bytes += part.hbm_bytes
        for lvl, s in part.comm_s.items():
            sc.comm_s[lvl] = sc.comm_s.get(lvl, 0.0) + s
        sc.memory_gb = part.memory_gb
        if i == 0:
            sc.detail.update(part.detail)
    sc.detail.update(
        turns=t.turns,
        turn_tokens=g,
        observation_tokens=o,
        kv_reuse=1.0 if reuse else 0.0,
        prefill_tokens_per_sample=T.prefill_tokens(c.P, t.turns, g, o, reuse),
        last_turn_s=per_turn[-1],
        first_turn_s=per_turn[0],
    )
    return sc


def env_cost(c: UnitContext, u: UnitPlan, name: str) -> StageCost:
    """The env stage: each rollout process (one per generation replica) waits for its
    samples' environment calls, the resets and a wave of steps after every turn
    (:func:`rpeg.perf.turns.env_seconds`). No turns stated: nothing to price."""
    sc = StageCost(name, (ENV_KIND,), format_devices(u.devices), u.num_devices)
    t = c.wl.turns
    if t is None:
        return sc
    per_process = c.N / _replicas(u)
    sc.time_s = T.env_seconds(per_process, t.turns, t.env_latency_s, t.env_concurrency)
    sc.detail.update(
        env_calls_per_sample=T.env_calls(t.turns),
        env_latency_s=t.env_latency_s,
        env_concurrency=float(t.env_concurrency),
        samples_per_process=per_process,
    )
    return sc
