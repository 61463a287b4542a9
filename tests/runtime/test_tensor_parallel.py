"""Tensor parallelism with plain activations (rpeg.runtime.tensor_parallel) on two gloo ranks:
the pairwise sum, a column-wise -> row-wise MLP against its dense twin, forward and backward."""

from __future__ import annotations

import pytest
import sharding_cases as C
import torch
import tp_mlp_cases as T


@pytest.fixture(scope="module")
def two_ranks():
    out = C.spawn(2, [("tp", "tensor_parallel", {"layout": {"tp": 2}})], port=29731)
    return out["tp"]


def test_the_pairwise_sum_is_the_sum_and_bit_identical_on_both_ranks(two_ranks):
    want = two_ranks[0]["mine"] + two_ranks[1]["mine"]
    assert not torch.equal(two_ranks[0]["mine"], two_ranks[1]["mine"])
    for r in (0, 1):
        torch.testing.assert_close(two_ranks[r]["summed"], want, atol=0, rtol=0)


def test_rank_reduce_over_a_gloo_pair_sums_and_maxes(two_ranks):
    for r in (0, 1):
        assert two_ranks[r]["reduce_sum"].tolist() == [3.0, 1.0]
        assert two_ranks[r]["reduce_max"].tolist() == [5, 7]


def test_a_split_mlp_equals_its_dense_twin_forward_and_backward(two_ranks):
    mlp, x = T.mlp_reference()
    x = x.clone().requires_grad_(True)
    y = mlp(x)
    (y * torch.arange(8.0)).sum().backward()
    names = [n for n, _ in mlp.named_parameters()]
    for r in (0, 1):
        got = two_ranks[r]
        torch.testing.assert_close(got["y"], y.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["x_grad"], x.grad, atol=1e-5, rtol=1e-5)  # f: summed
        for n, p in zip(names, mlp.parameters(), strict=True):
            torch.testing.assert_close(got["grads"][n], p.grad, atol=1e-5, rtol=1e-5, msg=n)
    # Megatron's split, as torch's Colwise/RowwiseParallel place them (DCP and FSDP2 see those)
    pl = two_ranks[0]["placements"]
    assert pl == {
        "0.weight": "(Shard(dim=0),)",
        "0.bias": "(Shard(dim=0),)",
        "2.weight": "(Shard(dim=1),)",
        "2.bias": "(Replicate(),)",
    }
    assert two_ranks[1]["local_shapes"] == {
        "0.weight": [6, 8],
        "0.bias": [6],
        "2.weight": [8, 6],
        "2.bias": [8],
    }


def test_one_copy_after_a_shared_norm_sums_both_consumers_gradients(two_ranks):
    """gate and up read the norm's output: one f on it (backward: one all-reduce of the sum of
    both partial gradients) gives the dense input and weight gradients."""
    gm, x = T.GatedMLP(), T.gated_input().requires_grad_(True)
    (gm(x) * torch.arange(8.0)).sum().backward()
    for r in (0, 1):
        got = two_ranks[r]
        torch.testing.assert_close(got["gated_x_grad"], x.grad, atol=1e-5, rtol=1e-5)
        for n in ("gate.weight", "up.weight", "down.weight"):
            want = gm.get_parameter(n).grad
            torch.testing.assert_close(got["gated_grads"][n], want, atol=1e-5, rtol=1e-5, msg=n)


def test_shard_linear_refuses_what_it_cannot_split():
    from rpeg.runtime.tensor_parallel import shard_linear

    with pytest.raises(ValueError, match="style 'diagonal': allowed colwise, rowwise"):
        shard_linear(torch.nn.Linear(2, 2), "diagonal", None)
    with pytest.raises(TypeError, match="needs an nn.Linear, got Conv1d"):
        shard_linear(torch.nn.Conv1d(2, 2, 1), "colwise", None)
    from rpeg.runtime.tensor_parallel import copy_once_after

    with pytest.raises(TypeError, match="column-wise linears"):
        copy_once_after(torch.nn.LayerNorm(2), [torch.nn.Linear(2, 2)])
