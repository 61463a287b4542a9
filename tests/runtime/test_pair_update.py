"""A same-host pair's update split in halves (rpeg.runtime.pair_update) equals the update of
the pair's mean gradient on one replica: two channel ends in two threads of this process, each
holding its own copy of the parameters and its own gradients."""

from __future__ import annotations

import pytest
import torch
from test_pair_channel import _both, _channel_pair

from rpeg.runtime.pair_update import PairSplit
from rpeg.runtime.updates import adamw

# 41 elements: the cut (21) falls inside the second tensor; the third and fourth are rank
# 1's; the fifth never gets a gradient (a frozen-in-this-update parameter)
SHAPES = [(3, 5), (7,), (4, 4), (1,), (2,)]
HAS_GRAD = [True, True, True, True, False]


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


def _grads(step: int, rank: int) -> list[torch.Tensor | None]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return [
        torch.randn(s, generator=g) * 3 if h else None
        for s, h in zip(SHAPES, HAS_GRAD, strict=True)
    ]


@pytest.mark.parametrize("amsgrad", [False, True])
def test_the_split_update_equals_the_mean_gradient_update(amsgrad):
    opts = {"lr": 0.05, "weight_decay": 0.1, "amsgrad": amsgrad}
    ref = _params(0)
    ref_opt = adamw(ref, **opts)
    ranks = [_params(0), _params(0)]
    opts_r = [adamw(ps, **opts) for ps in ranks]
    ca, cb = _channel_pair()
    splits = [PairSplit(ranks[0], ca, 0), PairSplit(ranks[1], cb, 1)]
    assert [splits[0].owned(p) for p in ranks[0]] == [(0, 15), (0, 6), None, None, None]
    assert [splits[1].owned(p) for p in ranks[1]] == [None, (6, 7), (0, 16), (0, 1), (0, 2)]
    try:
        for step in range(3):
            ga, gb = _grads(step, 0), _grads(step, 1)
            for p, a, b in zip(ref, ga, gb, strict=True):
                p.grad = None if a is None else (a + b) / 2
            want = float(
                torch.nn.utils.clip_grad_norm_([p for p in ref if p.grad is not None], 1.0)
            )
            ref_opt.step()
            for ps, gs in zip(ranks, (ga, gb), strict=True):
                for p, gr in zip(ps, gs, strict=True):
                    p.grad = None if gr is None else gr.clone()

            def update(i):
                splits[i].reduce_scatter(divide=2.0)
                norm = splits[i].clip(1.0)
                splits[i].step(opts_r[i])
                return norm

            na, nb = _both(lambda: update(0), lambda: update(1))
            assert na == nb == pytest.approx(want, rel=1e-6) and want > 1.0  # clipped
            for pa, pb, pr in zip(*ranks, ref, strict=True):
                assert torch.equal(pa, pb)  # the same bits on both ranks
                torch.testing.assert_close(pa.detach(), pr.detach(), atol=1e-6, rtol=1e-6)
        # each rank updated only its half of the moments; consolidated, both hold the whole
        _both(lambda: splits[0].consolidate(opts_r[0]), lambda: splits[1].consolidate(opts_r[1]))
        keys = ["exp_avg", "exp_avg_sq", "step"] + (["max_exp_avg_sq"] if amsgrad else [])
        for pa, pb, pr in zip(*ranks, ref, strict=True):
            sa, sb, sr = opts_r[0].state.get(pa), opts_r[1].state.get(pb), ref_opt.state.get(pr)
            if sr is None:  # never had a gradient
                assert sa is None and sb is None
                continue
            for k in keys:
                assert torch.equal(sa[k], sb[k]), k
                torch.testing.assert_close(sa[k], sr[k], atol=1e-6, rtol=1e-5, msg=k)
            assert float(sa["step"]) == 3.0
    finally:
        ca.close()
        cb.close()


def test_only_plain_cpu_parameters_of_one_dtype_are_split():
    assert PairSplit.usable([torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))])
    assert not PairSplit.usable([])
    mixed = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2).double())]
    assert not PairSplit.usable(mixed)
    with pytest.raises(ValueError, match="me must be 0 or 1"):
        PairSplit([], None, 2)  # type: ignore[arg-type]
