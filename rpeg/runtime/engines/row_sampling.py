"""Sampling with one random stream per row: what row ``i`` of a batch samples depends on its
own seed and the decode step, never on which other rows share its batch or rank.

So a rollout split over data-parallel ranks (each rank decoding its prompts with the seed of
its first row) samples the tokens the single-process trainer samples for the whole batch,
up to the last bits of the logits (the layouts sum their matmuls in different orders): runs
are reproducible across layouts, and ``rpeg train`` and ``--local`` run the same workload
(the same response lengths step by step). vLLM seeds each request the same way
(:mod:`rpeg.runtime.engines.vllm`: sample ``i`` of a call gets ``seed + i``). A call may
instead give every row its own seed (:func:`row_seeds`): a multi-turn rollout's later turns
generate only the rows still going, each at :func:`turn_seed` of its own row seed, so a
sample's turns do not depend on which other rows finished before it.

How (a counter-based generator in the sense of Salmon et al., SC'11, "Parallel random numbers:
as easy as 1, 2, 3"; the mixing function here is a 32-bit integer hash, not Philox):

* a row's seed ``s`` (``0 <= s < 2**62``) is hashed to a 32-bit key ``k``;
* the uniform of that row at decode step ``t`` is ``hash(k + (t + 1) * golden) >> 8``,
  scaled by ``2**-24`` (24 bits: exact in float32);
* the token is the inverse CDF of the row's distribution at that uniform: the first token
  whose cumulative probability exceeds ``u * total`` -- exact sampling from the distribution,
  its probabilities resolved to ``2**-24``, and never a token of probability 0 (a top-k /
  top-p filtered one).

All integer arithmetic stays below ``2**63`` (32-bit products are split in 16-bit halves), so
no tensor op overflows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
#: rows one step's rollout may have (row seeds of consecutive steps never overlap)
ROWS_PER_STEP = 1 << 24
_SEED_SPACE = 1 << 62
#: a row's seed at turn ``t`` of a multi-turn sample lies ``t * TURN_STRIDE`` above its own
#: (turn-0) seed: ``ROWS_PER_STEP * 2**31``, past the rows of every step a run reaches
TURN_STRIDE = ROWS_PER_STEP << 31


def rollout_seed(run_seed: int, step: int, first_row: int = 0) -> int:
    """Seed of row ``first_row`` of the rollout of ``step`` (row ``first_row + i`` uses this
    plus ``i``): the value an engine's ``seed`` takes for a batch whose first row is global
    row ``first_row`` of the step (0 for the whole batch)."""
    if not 0 <= first_row < ROWS_PER_STEP:
        raise ValueError(f"first_row={first_row} outside [0, {ROWS_PER_STEP})")
    return ((run_seed * 1_000_003 + step) * ROWS_PER_STEP + first_row) % _SEED_SPACE


def turn_seed(row_seed: int, turn: int) -> int:
    """The seed of a multi-turn sample's turn ``turn`` (0-based) from the sample's own seed
    ``row_seed`` (its :func:`rollout_seed` row seed): the row seed itself at turn 0 (a
    single-turn response's), ``+ turn * TURN_STRIDE`` after. A function of the run seed, the
    step, the row's position and the turn only, never of which rows share the turn's batch;
    within a run no two (step, row, turn) share a seed (steps < 2**31, turns < 2**7)."""
    if turn < 0:
        raise ValueError(f"turn={turn} < 0")
    return (row_seed + turn * TURN_STRIDE) % _SEED_SPACE


def row_seeds(seed: int | Sequence[int], rows: int) -> list[int]:
    """Each row's seed in a call of ``rows`` rows: ``seed + i`` for an int (a batch whose
    rows are consecutive positions), or one seed per row as given (rows that are not: the
    turns of a multi-turn rollout whose other rows have finished)."""
    if isinstance(seed, int):
        return [(seed + i) % _SEED_SPACE for i in range(rows)]
    out = [int(s) % _SEED_SPACE for s in seed]
    if len(out) != rows:
        raise ValueError(f"{len(out)} row seeds for {rows} rows")
    return out


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for int64 ``x`` in ``[0, 2**32)`` without passing ``2**63``."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit mixer (xor-shift / multiply rounds; constants from C. Wellons'
    "hash prospector" lowbias32) on int64 tensors holding values in ``[0, 2**32)``."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_keys(
    seed: int | Sequence[int], rows: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``[rows]`` int64 keys of the rows seeded ``seed, seed + 1, ...`` (an int) or of the
    rows' own seeds (a sequence: :func:`row_seeds`)."""
    s = torch.as_tensor(row_seeds(seed, rows), dtype=torch.int64, device=device)
    return _hash32(_hash32(s & _M32) ^ (s >> 32))


def row_uniforms(keys: torch.Tensor, step: int) -> torch.Tensor:
    """``[B]`` float32 uniforms in ``[0, 1)`` of the rows with ``keys`` at decode ``step``."""
    x = _hash32((keys + (step + 1) * _GOLDEN) & _M32)
    return (x >> 8).to(torch.float32) * (1.0 / (1 << 24))


def row_uniforms_block(keys: torch.Tensor, first_step: int, steps: int) -> torch.Tensor:
    """``[steps, B]``: :func:`row_uniforms` of decode steps ``first_step .. first_step + steps
    - 1`` in one pass (the same values; a decode loop's per-token hashing in one op chain)."""
    t = torch.arange(first_step + 1, first_step + steps + 1, dtype=torch.int64, device=keys.device)
    x = _hash32((keys[None, :] + t[:, None] * _GOLDEN) & _M32)
    return (x >> 8).to(torch.float32) * (1.0 / (1 << 24))


def sample_rows(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``[B]`` token ids: for each row of ``probs`` ``[B, V]`` (non-negative, any positive
    total), the first token whose cumulative probability exceeds ``u * total`` (``u`` ``[B]``
    in ``[0, 1)``)."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:].contiguous()
    tok = torch.searchsorted(cdf, u[:, None].to(cdf.dtype) * total, right=True)
    # u * total can round up to total: the last token with probability > 0 then
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(tok, last).squeeze(-1)
