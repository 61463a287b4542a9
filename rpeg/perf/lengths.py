"""Response-length distribution: a lognormal clamped at the generation cap.

A synchronous rollout lasts as long as its longest response; its cost depends on how many
sequences are still alive at each decode step. Both follow from this distribution, whose
median is solved so that the clamped mean equals the workload's mean length.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist
from typing import Any

_N = NormalDist()
SQ2 = math.sqrt(2.0)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / SQ2)


@lru_cache(maxsize=4096)
def fit_mu(mean: float, cap: float, sigma: float) -> float:
    """mu of a lognormal(mu, sigma) whose min(X, cap) has mean ``mean`` (< cap)."""
    mean = min(mean, cap * 0.999)
    lo, hi = math.log(mean) - 3 * sigma - 5, math.log(cap) + 6 * sigma
    lc = math.log(cap)
    for _ in range(60):
        mu = 0.5 * (lo + hi)
        m = math.exp(mu + sigma * sigma / 2) * _phi((lc - mu - sigma * sigma) / sigma) + cap * (
            1 - _phi((lc - mu) / sigma)
        )
        if m < mean:
            lo = mu
        else:
            hi = mu
    return 0.5 * (lo + hi)


class LengthDist:
    """min(lognormal(mu, sigma), cap), parameterised by its mean and cap."""

    __slots__ = ("cap", "lc", "mean", "mu", "sigma")

    def __init__(self, mean: float, cap: float, sigma: float):
        self.cap = float(cap)
        self.mean = min(float(mean), self.cap)
        self.sigma = sigma
        self.lc = math.log(self.cap)
        self.mu = (
            fit_mu(self.mean, self.cap, sigma) if self.mean < self.cap else self.lc + 10 * sigma
        )

    def survival(self, t: float) -> float:
        """P(L > t)."""
        if t >= self.cap:
            return 0.0
        if t <= 0:
            return 1.0
        return 1.0 - _phi((math.log(t) - self.mu) / self.sigma)

    @property
    def p_cap(self) -> float:
        """Probability that a response hits the cap (is truncated)."""
        return 1.0 - _phi((self.lc - self.mu) / self.sigma)

    def expected_max(self, n: int) -> float:
        """Length of the longest of ``n`` responses (the 1-1/(n+1) quantile, clamped)."""
        if n * self.p_cap >= 0.5:
            return self.cap
        q = 1.0 - 1.0 / (n + 1)
        return min(self.cap, math.exp(self.mu + self.sigma * _N.inv_cdf(q)))

    def moment(self, n: int) -> float:
        """E[min(X, cap)^n]."""
        s, mu = self.sigma, self.mu
        return (
            math.exp(n * mu + n * n * s * s / 2) * _phi((self.lc - mu - n * s * s) / s)
            + self.cap**n * self.p_cap
        )

    def token_spread(self, prompt: float) -> float:
        """Coefficient of variation (sd / mean) of one sample's tokens, prompt + response."""
        mean = prompt + self.mean
        var = max(0.0, self.moment(2) - self.mean**2)
        return math.sqrt(var) / mean if mean > 0 else 0.0

    def second_moment(self) -> float:
        """E[min(X, cap)^2] (for attention terms)."""
        return self.moment(2)

    def padded_spread(self, rows: int, prompt: float) -> float:
        """Coefficient of variation of a micro-batch of ``rows`` rows padded to its longest:
        its tokens are ``rows x (prompt + the longest of rows responses)``
        (:func:`_max_moments`); :meth:`token_spread` for one row."""
        if rows <= 1:
            return self.token_spread(prompt)
        m1, m2 = _max_moments(self.mu, self.sigma, self.cap, int(rows))
        mean = prompt + m1
        return math.sqrt(max(0.0, m2 - m1 * m1)) / mean if mean > 0 else 0.0


#: quantile points of the midpoint rule :func:`_max_moments` integrates over
_MAX_POINTS = 400


@lru_cache(maxsize=4096)
def _max_moments(mu: float, sigma: float, cap: float, n: int) -> tuple[float, float]:
    """(E[M], E[M^2]) of the longest ``M`` of ``n`` draws of min(lognormal(mu, sigma), cap):
    ``M``'s quantile at ``u`` is the draws' quantile at ``u^(1/n)``, integrated over ``u``
    by the midpoint rule."""
    m1 = m2 = 0.0
    for i in range(_MAX_POINTS):
        p = min(((i + 0.5) / _MAX_POINTS) ** (1.0 / n), 1.0 - 1e-12)  # inv_cdf needs p < 1
        x = min(cap, math.exp(mu + sigma * _N.inv_cdf(p)))
        m1 += x
        m2 += x * x
    return m1 / _MAX_POINTS, m2 / _MAX_POINTS


def truncated_mean(median: float, cap: float, sigma: float) -> float:
    """E[min(X, cap)] for X ~ lognormal(log(median), sigma)."""
    mu, lc = math.log(median), math.log(cap)
    return math.exp(mu + sigma * sigma / 2) * _phi((lc - mu - sigma * sigma) / sigma) + cap * (
        1 - _phi((lc - mu) / sigma)
    )


def code_scaled(kind: str, domain: str | None) -> bool:
    """Whether :func:`prior_mean` scales the median for the task: a reasoning model on code."""
    return domain == "code" and kind == "reasoning"


def prior_mean(
    kind: str, cap: float, calib: object, scale: float = 1.0, domain: str | None = None
) -> float:
    """Mean response length of a model of ``kind`` at generation cap ``cap`` when the
    workload does not state it: the model's untruncated ("natural") length is lognormal
    with the median of its kind (``Calibration.response_median_reasoning`` /
    ``response_median_instruct``; a reasoning model's at a 4,096 cap, times (cap / 4,096) **
    ``reasoning_cap_exponent``) and ``length_sigma``, clamped at the cap. The same rule for
    every model and run; ``scale`` moves the median (interval bounds); ``domain`` "code" (the
    prompts ask for programs) multiplies a reasoning model's median by
    ``Calibration.response_scale_code``. Sources of the medians: docs/perf-model.md,
    "Response-length prior"."""
    cal: Any = calib
    if kind == "reasoning":  # a thinking trace grows with its budget
        median = cal.response_median_reasoning * (cap / cal.reasoning_cap_ref) ** (
            cal.reasoning_cap_exponent
        )
    else:
        median = cal.response_median_instruct
    if code_scaled(kind, domain):
        median *= cal.response_scale_code
    return min(cap * 0.999, truncated_mean(median * scale, cap, calib.length_sigma))  # type: ignore[attr-defined]


def expected_max_normal(n: int) -> float:
    """Expected largest of ``n`` independent standard normals, by Blom's approximation
    ``Phi^-1((n - 0.375) / (n + 0.25))`` (G. Blom, *Statistical Estimates and Transformed
    Beta-Variables*, 1958): 0 for one, 0.59 for two (exact 0.56), 1.43 for eight (1.42)."""
    if n <= 1:
        return 0.0
    return _N.inv_cdf((n - 0.375) / (n + 0.25))
