"""Memory-lean losses: chunked log-probs equal the full-logits computation; micro-batches of a
fixed size or of a token budget (and the count agreement sharded ranks need)."""

from __future__ import annotations

import copy

import pytest
import sharding_cases as C
import torch

from rpeg.runtime.algorithms import chunked_token_logprobs, entropy_from_logits, token_logprobs
from rpeg.runtime.micro_batches import padded_tokens, plan_micro_batches
from rpeg.runtime.model_io import lm_logprobs
from rpeg.runtime.parallel import RankReduce


@pytest.mark.parametrize("chunk", [1, 3, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_equal_full_logits(chunk, temperature):
    g = torch.Generator().manual_seed(0)
    h = (0.5 * torch.randn(3, 7, 16, generator=g)).requires_grad_()
    w = (0.5 * torch.randn(50, 16, generator=g)).requires_grad_()
    y = torch.randint(0, 50, (3, 7), generator=g)
    coef = torch.randn(3, 7, generator=g)

    logits = torch.nn.functional.linear(h, w)
    lp_ref = token_logprobs(logits, y, temperature)
    ent_ref = entropy_from_logits(logits, temperature)
    ((lp_ref * coef).sum() + ent_ref.sum()).backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None

    lp, ent = chunked_token_logprobs(
        h, w, y, temperature, with_entropy=True, entropy_grad=True, chunk_positions=chunk
    )
    ((lp * coef).sum() + ent.sum()).backward()
    torch.testing.assert_close(lp, lp_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, ent_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(h.grad, gh, atol=1e-6, rtol=0)
    torch.testing.assert_close(w.grad, gw, atol=1e-6, rtol=0)


def test_entropy_only_differentiated_with_a_coefficient():
    h = torch.randn(2, 4, 8, requires_grad=True)
    w = torch.randn(11, 8)
    y = torch.zeros(2, 4, dtype=torch.long)
    lp, ent = chunked_token_logprobs(h, w, y, with_entropy=True, entropy_grad=False)
    assert lp.requires_grad and not ent.requires_grad
    _, none = chunked_token_logprobs(h, w, y)
    assert none is None


def test_only_several_chunks_are_recomputed_in_backward(monkeypatch):
    # one chunk holds the same logits in backward either way: it is not checkpointed
    import torch.utils.checkpoint as ck

    calls = []
    real = ck.checkpoint
    monkeypatch.setattr(ck, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    h = torch.randn(2, 6, 8, requires_grad=True)
    w = torch.randn(11, 8)
    y = torch.zeros(2, 6, dtype=torch.long)
    for chunk, expected in ((None, 0), (6, 0), (4, 2), (1, 6)):
        calls.clear()
        lp, _ = chunked_token_logprobs(h, w, y, with_entropy=True, chunk_positions=chunk)
        lp.sum().backward()
        assert len(calls) == expected, chunk


def test_lm_logprobs_equal_the_models_logits():
    from rpeg.runtime.model_io import LogprobRequest

    m, _ = C.model()
    b = C.batch(0)
    r = b.response_ids.shape[1]
    ids, mask, pos = b.input_ids, b.attention_mask, b.position_ids
    with torch.no_grad():
        logits = m(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        req = lm_logprobs(m, ids, mask, pos, b.response_ids, LogprobRequest(temperature=0.8))
    # positions P-1 .. P+R-2 predict the R response tokens
    ref = token_logprobs(logits[:, -r - 1 : -1], b.response_ids, 0.8)
    torch.testing.assert_close(req.logprobs, ref, atol=1e-6, rtol=0)
    assert type(m.lm_head).__name__ == "TokenLogprobHead"
    # outside a request the head is a plain linear layer: generation still gets logits
    with torch.no_grad():
        again = m(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    torch.testing.assert_close(again, logits, atol=0, rtol=0)


# --- micro-batches ----------------------------------------------------------------------------
def _forwards(worker, fn, batch) -> int:
    calls = []
    h = worker.lm.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        fn(batch)
    finally:
        h.remove()
    return len(calls)


@pytest.mark.parametrize(("mbs", "expected"), [(1, 8), (2, 4), (3, 3), (8, 1)])
def test_micro_batch_size_sets_the_number_of_forwards(mbs, expected):
    cfg = C.config(**{"workload.micro_batch_size": mbs})
    m, tok = C.model()
    w = C.policy(cfg, m, tok)
    assert _forwards(w, w.compute_logprobs, C.batch(0)) == expected
    b = C.with_old_logprobs(C.batch(0), w)
    assert _forwards(w, w.train_step, b) == expected  # one mini-batch, one epoch


def test_token_budget_packs_by_padded_size():
    b = C.batch(0)
    # (prompt, response) per row: 0 (3,2) 1 (5,7) 2 (4,5) 3 (6,3) 4 (3,6) 5 (4,4) 6 (6,2) 7 (5,7)
    # longest first: 1, 7, 2, 3, 4, 5, 6, 0. Budget 24 = rows x (longest prompt + response):
    # [1,7] 2x12=24 | +2 -> 3x12 > 24: [2,3] 2x(6+5)=22 | +4 -> 3x12: [4,5] 2x(4+6)=20 |
    # +6 -> 3x12: [6,0] 2x(6+2)=16
    parts = plan_micro_batches(b, micro_batch_size=64, max_tokens=24)
    assert parts == [[1, 7], [2, 3], [4, 5], [6, 0]]
    assert [padded_tokens(b, ix) for ix in parts] == [24, 22, 20, 16]
    one_each = plan_micro_batches(b, micro_batch_size=64, max_tokens=1)
    assert len(one_each) == 8  # a sample over the budget forms its own micro-batch


def test_ranks_agree_on_the_micro_batch_count():
    b = C.batch(0)
    peers_need = 5  # another rank of the group needs five micro-batches
    reduce = RankReduce(world_size=2, max=lambda t: torch.maximum(t, torch.tensor([peers_need])))
    fixed = plan_micro_batches(b, micro_batch_size=4, reduce=reduce)
    assert len(fixed) == 5 and sorted(i for ix in fixed for i in ix) == list(range(8))
    budget = plan_micro_batches(b, micro_batch_size=64, max_tokens=100, reduce=reduce)
    assert len(budget) == 5 and sorted(i for ix in budget for i in ix) == list(range(8))
    many = plan_micro_batches(
        b.select([0, 1]), 1, reduce=RankReduce(max=lambda t: t + 2)
    )  # more parts than rows: empty parts (run as zero-weight dummies)
    assert len(many) == 4 and sum(1 for ix in many if not ix) == 2


def test_token_budget_train_step_equals_fixed_micro_batches():
    m, tok = C.model()
    runs = []
    for over in ({"workload.micro_batch_size": 2}, {"workload.max_tokens_per_micro_batch": 24}):
        cfg = C.config(**over)
        w = C.policy(cfg, copy.deepcopy(m), tok)
        b = C.with_old_logprobs(C.batch(0), w)
        calls = []
        h = w.lm.register_forward_pre_hook(lambda *a, calls=calls: calls.append(1))
        metrics = w.train_step(b)
        h.remove()
        runs.append((len(calls), metrics))
    (n_fixed, fixed), (n_budget, budget) = runs
    assert (n_fixed, n_budget) == (4, 4)  # [0,1] [2,3] ... vs [1,7] [2,3] [4,5] [6,0]
    for key in ("pg_loss", "kl", "entropy", "grad_norm"):
        assert budget[key] == pytest.approx(fixed[key], abs=1e-6), key


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_worker_on_cuda_in_bf16_returns_cpu_tensors():
    import math

    m, tok = C.model()
    m.to(device="cuda", dtype=torch.bfloat16)
    cfg = C.config(**{"algorithm.name": "ppo", "algorithm.share_actor_critic": True})
    w = C.policy(cfg, m, tok)
    assert w.module.value_head.proj.weight.dtype == torch.bfloat16
    b = C.with_old_logprobs(C.batch(0), w)
    assert b.old_logprobs.device.type == "cpu" and b.old_logprobs.dtype == torch.float32
    metrics = w.train_step(b)
    assert math.isfinite(metrics["pg_loss"]) and math.isfinite(metrics["grad_norm"])
    assert all(len(t) <= 6 for t in C.greedy(w, C.PROMPTS))
    assert all(v.device.type == "cpu" for v in w.get_weights().values())
