"""The vLLM engine against the real vLLM (vLLM's CPU build in CI): the torch engine's greedy
tokens and log-probs, the trainer's log-probs of sampled tokens, seeds and caps per request,
and weight updates through the update group that leave the engine as a fresh one on the same
weights -- untied and tied heads -- with nothing left behind at shutdown.

Two engines in all (one a head kind; each built once, ~20-100 s on the CI machine). An
engine built *fresh* on weights W1 answers first; it is then updated to W0 (checked against
the torch engine) and back to W1, after which it must answer exactly as it did fresh.
"""

from __future__ import annotations

import copy

import pytest
import torch
from leaks import settle, shm_segments, vllm_processes
from tiny_engines import engine_of, tiny

from rpeg.runtime.engines.base import SamplingParams
from rpeg.runtime.engines.torch_engine import TorchEngine

TEXTS = ["12+7=", "3*4=", "100-1=", "(2+3)*4="]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


def _moved(model, seed: int, scale: float = 0.05):
    """A copy with every weight moved by ``scale`` x N(0, 1) (an RL step's worth, and more)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


def _prompts(tok):
    return [tok(t)["input_ids"] for t in TEXTS]


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a, b, atol: float):
    assert a.response_ids.tolist() == b.response_ids.tolist()
    assert a.lengths.tolist() == b.lengths.tolist()
    diff = float((a.logprobs - b.logprobs).abs().max())
    assert diff <= atol, f"max |delta log-prob| {diff:.3g} > {atol}"


@pytest.fixture(scope="module")
def untied(untied_engine):
    return untied_engine  # the session's engine (conftest), fresh on W0


def test_greedy_tokens_and_logprobs_equal_the_torch_engines(untied):
    model, tok, eng = untied
    out = eng.generate(_prompts(tok), GREEDY)
    assert eng.processed_logprobs and out.logprobs_exact
    assert int(out.lengths.sum()) > 0
    ref = TorchEngine(model, tok.pad_token_id, tok.eos_token_id)
    _assert_same(out, ref.generate(_prompts(tok), GREEDY), atol=1e-5)


def test_sampled_logprobs_are_the_trainers_at_the_sampling_temperature(untied):
    """processed_logprobs: vLLM reports log_softmax(logits / T) of the sampled token, what
    the trainer's forward computes (raw_logprobs, vLLM's default, would be of T = 1)."""
    model, tok, eng = untied
    t = 0.7
    prompts = _prompts(tok)
    out = eng.generate(prompts, SamplingParams(max_new_tokens=10, temperature=t), seed=11)
    worst = 0.0
    for i, p in enumerate(prompts):
        n = int(out.lengths[i])
        resp = out.response_ids[i, :n].tolist()
        ids = torch.tensor([p + resp])
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1 : len(p) - 1 + n].float()
        lp = torch.log_softmax(logits / t, dim=-1).gather(-1, torch.tensor(resp)[:, None])[:, 0]
        worst = max(worst, float((lp - out.logprobs[i, :n]).abs().max()))
    assert worst <= 1e-5, worst


def test_each_request_has_its_own_seed_and_cap(untied):
    _, tok, eng = untied
    prompts = _prompts(tok)
    p = SamplingParams(max_new_tokens=12, temperature=1.0)
    caps = [2, 12, 5, 12]
    a = eng.generate(prompts, p, seed=5, max_new_tokens=caps)
    b = eng.generate(prompts, p, seed=5, max_new_tokens=caps)
    assert a.response_ids.tolist() == b.response_ids.tolist()
    assert all(int(n) <= c for n, c in zip(a.lengths, caps, strict=True))
    # a sample is its own request: prompt i alone with seed 5 + i samples what it did in
    # the batch (row 2 is seeded 7)
    alone = eng.generate([prompts[2]], p, seed=7, max_new_tokens=[caps[2]])
    n = int(a.lengths[2])
    assert alone.response_ids[0, :n].tolist() == a.response_ids[2, :n].tolist()
    other = eng.generate(prompts, p, seed=6, max_new_tokens=caps)
    assert other.response_ids.tolist() != a.response_ids.tolist()


def _update_round_trip(eng, model_a, model_b, tok):
    """``eng``, fresh on A's weights: updated to B (== the torch engine on B), then back to A
    (== what it answered fresh)."""
    fresh = eng.generate(_prompts(tok), GREEDY)
    eng.update_weights(_weights(model_b), policy_version=1)
    assert eng.policy_version == 1
    moved = eng.last_update
    assert moved.tensors == len(dict(model_b.named_parameters()))  # a tied head: once
    assert moved.nbytes >= sum(p.numel() * 4 for p in model_b.parameters())
    at_b = eng.generate(_prompts(tok), GREEDY)
    ref_b = TorchEngine(model_b, tok.pad_token_id, tok.eos_token_id)
    _assert_same(at_b, ref_b.generate(_prompts(tok), GREEDY), atol=1e-5)
    assert float((at_b.logprobs - fresh.logprobs).abs().max()) > 1e-3  # the update showed
    eng.update_weights(_weights(model_a), policy_version=2)
    _assert_same(eng.generate(_prompts(tok), GREEDY), fresh, atol=1e-6)


def test_update_leaves_the_engine_as_a_fresh_one_untied_head(untied):
    """The shared engine (fresh on W0, its weights untouched by the tests before) to W1 and
    back: one engine start fewer than a fresh one on W1 (~1 min of the CI's vLLM part)."""
    model0, tok, eng = untied
    assert not model0.config.tie_word_embeddings and eng.policy_version == 0
    _update_round_trip(eng, model0, _moved(model0, seed=1), tok)


def test_update_with_a_tied_head_and_nothing_left_after_shutdown():
    """Tied: vLLM's in-place reload leaves the CPU build's packed lm_head stale unless it is
    re-packed (rpeg.runtime.engines.vllm_worker.repack_tied_head)."""
    shm0, procs0 = shm_segments(), vllm_processes()
    model0, tok = tiny(tied=True, seed=2)
    assert model0.config.tie_word_embeddings
    model1 = _moved(model0, seed=1)
    eng = engine_of(model1, tok)  # fresh on W1, to W0 and back
    try:
        _update_round_trip(eng, model1, model0, tok)
    finally:
        eng.shutdown()
    assert not settle(lambda: vllm_processes() - procs0), "a vLLM process outlived shutdown"
    assert not settle(lambda: shm_segments() - shm0), "a /dev/shm segment outlived shutdown"
