"""Lengths a run measured, kept by `rpeg calibrate` and used by later predictions of the same
model and task (rpeg.perf.calibration.run_lengths): the spread solved from the longest response, the
store in calibration.yaml, and a run config that states its own lengths keeping them."""

import math
from statistics import NormalDist

import pytest
import yaml

from rpeg.perf.calibration import fit, user_calibration_file
from rpeg.perf.calibration import run_lengths as RL
from rpeg.preflight import load_config


def test_sigma_is_solved_from_the_longest_of_a_steps_samples():
    # a cap far above the lengths: mean = exp(mu + s^2/2), the longest of n = 128 is the
    # 128/129 quantile exp(mu + s z): longest / mean = exp(s z - s^2 / 2); at s = 0.5:
    z = NormalDist().inv_cdf(128 / 129)
    longest = 3.0 * math.exp(0.5 * z - 0.125)
    assert RL.sigma_for_max(3.0, longest, 128, 1e6) == pytest.approx(0.5, rel=1e-3)
    # nothing to say: the longest at the cap, or not above the mean
    assert RL.sigma_for_max(3.0, 16.0, 128, 16.0) is None
    assert RL.sigma_for_max(3.0, 3.0, 128, 16.0) is None


def _truncated_mean_and_share(sigma: float, mean: float, cap: float) -> tuple[float, float]:
    """E[min(X, cap)] and P(X >= cap) of the lognormal(mu, sigma) with that truncated mean,
    by a midpoint sum over the log-length (independent of rpeg.perf.lengths)."""
    norm = NormalDist()

    def moments(mu):
        n, lo, hi = 4000, mu - 9 * sigma, math.log(cap)
        w = (hi - lo) / n
        below = sum(
            math.exp(lo + (i + 0.5) * w) * norm.pdf((lo + (i + 0.5) * w - mu) / sigma) / sigma * w
            for i in range(n)
        )
        share = 1 - norm.cdf((math.log(cap) - mu) / sigma)
        return below + cap * share, share

    lo, hi = math.log(mean) - 10, math.log(cap) + 10
    for _ in range(60):  # the truncated mean grows with mu
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if moments(mid)[0] < mean else (lo, mid)
    return moments(0.5 * (lo + hi))


def test_sigma_is_solved_from_the_share_cut_at_the_cap():
    """A step whose longest response is the cap says only "at least this spread"; the share
    of responses cut there says how much: the sigma found gives lognormal lengths of the
    run's mean that reach the cap that often (checked by summing the density)."""
    sigma = RL.sigma_for_cap_share(3.0, 0.006, 16.0)
    assert sigma is not None and 0.5 < sigma < 2.0
    mean, share = _truncated_mean_and_share(sigma, 3.0, 16.0)
    assert mean == pytest.approx(3.0, rel=1e-3) and share == pytest.approx(0.006, rel=1e-2)
    # a larger share needs a wider spread; nothing cut, or a mean at the cap, says nothing
    assert RL.sigma_for_cap_share(3.0, 0.03, 16.0) > sigma
    assert RL.sigma_for_cap_share(3.0, 0.0, 16.0) is None
    assert RL.sigma_for_cap_share(16.0, 0.5, 16.0) is None
    # more cut than any spread of that mean allows (at most mean / cap): the widest spread
    assert RL.sigma_for_cap_share(3.0, 0.5, 16.0) == RL.SIGMA_RANGE[1]


def test_lengths_are_kept_per_model_and_task_and_used_unless_the_config_states_them(tmp_path):
    cfg = load_config("configs/builtin.yaml")
    key = RL.task_key(cfg)
    assert "model=rpeg-tiny" in key and "task=arithmetic" in key and "difficulty=1" in key
    harder = cfg.with_overrides({"task": {**cfg.task.model_dump(), "difficulty": 2}})
    assert RL.task_key(harder) != key
    path = user_calibration_file()
    try:
        # the cluster's fitted values are written first; the lengths go beside them
        fit.write("local-cpu", {"train_eff_scale": 0.3}, "run A")
        RL.store("local-cpu", key, RL.RunLengths(2.9, 6.1, 0.25, "run A"))
        fit.write("local-cpu", {"train_eff_scale": 0.4}, "run B")  # a later calibration
        entry = yaml.safe_load(path.read_text())["clusters"]["local-cpu"]
        assert entry["train_eff_scale"] == 0.4 and key in entry[RL.LENGTHS_KEY]
        wl = RL.configured_workload(cfg)
        assert (wl.mean_prompt_tokens, wl.mean_response_tokens, wl.length_sigma) == (
            6.1,
            2.9,
            0.25,
        )
        assert wl.assumed == (
            "lengths measured by rpeg calibrate on run A: 2.9 response tokens, "
            "6.1 prompt tokens, length sigma 0.25",
        )
        # the planner prices the same workload (rpeg plan, the bench's baselines)
        from rpeg.search.problem import problem_from_config

        assert problem_from_config(cfg).workload == wl
        # a config stating its mean response keeps it (and its spread), takes the prompt
        own = cfg.with_overrides(
            {"workload": {**cfg.workload.model_dump(), "mean_response_tokens": 5}}
        )
        wl = RL.configured_workload(own)
        assert (wl.mean_prompt_tokens, wl.mean_response_tokens, wl.length_sigma) == (6.1, 5, None)
        # another task of the same model: the prior's lengths, no assumption added
        wl = RL.configured_workload(harder)
        assert wl.mean_response_tokens is None and wl.mean_prompt_tokens == 32 and not wl.assumed
    finally:
        path.unlink(missing_ok=True)
    assert RL.lookup("local-cpu", key) is None
