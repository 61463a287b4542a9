"""The torch generation engine: KV cache, padding, log-probs, determinism, stop tokens, caps."""

import pytest
import torch

from rpeg.runtime.algorithms import token_logprobs
from rpeg.runtime.engines import GenerationEngine, SamplingParams, TorchEngine
from rpeg.runtime.engines.torch_engine import filter_logits, left_pad, positions_from_mask

PROMPTS = [[1, 20, 21, 22, 15], [1, 23], [1, 30, 31, 32, 33, 34, 35, 36], [1, 40, 41]]


def _engine(tiny, **kw):
    model, tok = tiny
    return TorchEngine(model, tok.pad_token_id, tok.eos_token_id, **kw)


def test_protocol(tiny):
    assert isinstance(_engine(tiny), GenerationEngine)


def test_greedy_cache_equals_no_cache(tiny):
    p = SamplingParams(max_new_tokens=10, temperature=0)
    a = _engine(tiny).generate(PROMPTS, p)
    b = _engine(tiny, use_cache=False).generate(PROMPTS, p)
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)


def test_left_padding_does_not_change_results(tiny):
    p = SamplingParams(max_new_tokens=8, temperature=0)
    eng = _engine(tiny)
    batched = eng.generate(PROMPTS, p)
    for i, prompt in enumerate(PROMPTS):
        single = eng.generate([prompt], p)
        n = int(single.lengths[0])
        assert torch.equal(single.response_ids[0, :n], batched.response_ids[i, :n])
        torch.testing.assert_close(
            single.logprobs[0, :n], batched.logprobs[i, :n], atol=1e-4, rtol=0
        )


def test_sampling_logprobs_match_forward(tiny):
    model, _ = tiny
    temp = 0.8
    out = _engine(tiny).generate(
        PROMPTS, SamplingParams(max_new_tokens=12, temperature=temp, top_k=20, top_p=0.9), seed=3
    )
    p_ids, p_mask = left_pad(PROMPTS, 0)
    ids = torch.cat([p_ids, out.response_ids], 1)
    mask = torch.cat([p_mask, out.mask], 1)
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)
        ).logits
    r = out.response_ids.shape[1]
    lp = token_logprobs(logits[:, -r - 1 : -1], out.response_ids, temp) * out.mask
    torch.testing.assert_close(lp, out.logprobs, atol=1e-4, rtol=0)


def test_deterministic_under_seed(tiny):
    p = SamplingParams(max_new_tokens=12, temperature=1.0)
    eng = _engine(tiny)
    a = eng.generate(PROMPTS, p, seed=7)
    b = eng.generate(PROMPTS, p, seed=7)
    c = eng.generate(PROMPTS, p, seed=8)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=12),
        SamplingParams(max_new_tokens=12, temperature=0.7, top_k=20, top_p=0.9),
    ],
)
def test_a_split_batch_samples_what_the_whole_batch_samples(tiny, params):
    # row i is sampled from seed + i: two ranks with halves of the prompts (the second one
    # seeded with its first row's index) draw the single process's tokens
    eng = _engine(tiny)
    prompts = PROMPTS * 3
    whole = eng.generate(prompts, params, seed=1000)
    parts = [
        eng.generate(prompts[:5], params, seed=1000),
        eng.generate(prompts[5:], params, seed=1005),
    ]
    for i, (out, row) in enumerate(
        [(parts[0], r) for r in range(5)] + [(parts[1], r) for r in range(7)]
    ):
        n = int(whole.lengths[i])
        assert int(out.lengths[row]) == n
        assert torch.equal(out.response_ids[row, :n], whole.response_ids[i, :n])
    # the same prompt in another row of the batch gets another sample stream
    assert not all(torch.equal(whole.response_ids[i], whole.response_ids[i + 4]) for i in range(4))


def test_one_seed_per_row_samples_what_those_rows_sample_in_the_whole_batch(tiny):
    # rows 1, 4 and 6 of a batch, given alone with their seeds 1001, 1004, 1006 (a
    # multi-turn turn whose other rows finished), draw the whole batch's tokens for them
    eng = _engine(tiny)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    prompts = PROMPTS * 2
    whole = eng.generate(prompts, params, seed=1000)
    rows = [1, 4, 6]
    some = eng.generate([prompts[r] for r in rows], params, seed=[1000 + r for r in rows])
    for j, r in enumerate(rows):
        n = int(whole.lengths[r])
        assert int(some.lengths[j]) == n
        assert torch.equal(some.response_ids[j, :n], whole.response_ids[r, :n])
    with pytest.raises(ValueError, match="2 row seeds for 3 rows"):
        eng.generate([prompts[r] for r in rows], params, seed=[1, 2])


def test_stop_tokens_and_per_sample_caps(tiny):
    eng = _engine(tiny)
    greedy = eng.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=0))
    first = int(greedy.response_ids[0, 0])
    out = eng.generate(
        PROMPTS, SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(first,))
    )
    assert int(out.lengths[0]) == 1 and bool(out.finished[0])  # stop token kept, response ended
    capped = eng.generate(
        PROMPTS, SamplingParams(max_new_tokens=6, temperature=0), max_new_tokens=[1, 2, 3, 0]
    )
    assert capped.lengths.tolist() == [1, 2, 3, 0]
    assert (capped.logprobs[capped.mask == 0] == 0).all()
    assert torch.equal(capped.response_ids[2, :3], greedy.response_ids[2, :3])


def test_filter_logits():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    k2 = filter_logits(logits, top_k=2)
    assert torch.isinf(k2[0, 2:]).all() and torch.isfinite(k2[0, :2]).all()
    # probs ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.7 keeps the first two (0.64 < 0.7)
    p = filter_logits(logits, top_p=0.7)
    assert torch.isfinite(p[0, :2]).all() and torch.isinf(p[0, 2:]).all()
    p = filter_logits(logits, top_p=0.5)
    assert torch.isfinite(p[0, 0]) and torch.isinf(p[0, 1:]).all()


def test_vllm_engine_imports_lazily():
    from rpeg.runtime.engines import vllm as vllm_mod

    assert hasattr(vllm_mod, "VLLMEngine")
    try:
        import vllm  # noqa: F401
    except ImportError:
        from rpeg.errors import RpegError

        with pytest.raises(RpegError, match="vllm"):
            vllm_mod.VLLMEngine.build("/nonexistent", pad_id=0, eos_id=2, tie_word_embeddings=True)
