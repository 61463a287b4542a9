"""The torch engine's streaming decode: the same samples as ``generate`` with the same seed,
handed out by prompt group as soon as every row of the group has finished, while the rest
of the batch decodes; engines without it (vLLM) hand out every group at the end."""

import torch

from rpeg.runtime.engines import SamplingParams, TorchEngine
from rpeg.runtime.engines.base import GenerationOutput, generate_in_groups

PROMPTS = [[1, 20, 21, 22, 15], [1, 23], [1, 30, 31, 32, 33, 34, 35, 36], [1, 40, 41]]
K = 3  # samples per prompt


def _engine(tiny):
    model, tok = tiny
    return TorchEngine(model, tok.pad_token_id, tok.eos_token_id)


def _rows():
    rep = [p for p in PROMPTS for _ in range(K)]
    groups = [list(range(i * K, (i + 1) * K)) for i in range(len(PROMPTS))]
    return rep, groups


def _caps():
    # one prompt group per cap, so the groups finish at different steps whatever is sampled
    return [c for c in (2, 9, 4, 6) for _ in range(K)]


def test_streamed_groups_equal_the_whole_batch(tiny):
    rep, groups = _rows()
    p = SamplingParams(max_new_tokens=9, temperature=1.0)
    eng = _engine(tiny)
    whole = eng.generate(rep, p, seed=7, max_new_tokens=_caps())
    chunks = list(eng.generate_streaming(rep, p, groups=groups, seed=7, max_new_tokens=_caps()))
    seen = [g for idx, _ in chunks for g in idx]
    assert sorted(seen) == [0, 1, 2, 3] and len(seen) == 4  # every group exactly once
    for idx, out in chunks:
        rows = [r for g in idx for r in groups[g]]
        n = out.response_ids.shape[1]
        assert n == int(whole.lengths[rows].max())  # cut to the longest of its rows
        assert torch.equal(out.response_ids, whole.response_ids[rows, :n])
        assert torch.equal(out.lengths, whole.lengths[rows])
        assert torch.equal(out.finished, whole.finished[rows])
        torch.testing.assert_close(out.logprobs, whole.logprobs[rows, :n], atol=0, rtol=0)
    # released early: the first group out (cap 2) after at most 2 decode steps, the last
    # after the longest row; released in the order the caps end
    assert chunks[0][0] == [0] and chunks[0][1].stats["decode_steps"] <= 2
    assert chunks[-1][1].stats["decode_steps"] == whole.stats["decode_steps"]
    assert [g for idx, _ in chunks for g in idx] == [0, 2, 3, 1]


def test_min_groups_batches_the_releases(tiny):
    rep, groups = _rows()
    p = SamplingParams(max_new_tokens=9, temperature=1.0)
    chunks = list(
        _engine(tiny).generate_streaming(
            rep, p, groups=groups, min_groups=2, seed=7, max_new_tokens=_caps()
        )
    )
    assert [len(idx) for idx, _ in chunks] == [2, 2]  # two at a time


class _WholeBatchOnly:
    """An engine with ``generate`` only (like the vLLM engine)."""

    policy_version = 5

    def generate(self, prompt_ids, params, *, seed=None, max_new_tokens=None):
        b = len(prompt_ids)
        return GenerationOutput(
            response_ids=torch.arange(b)[:, None].repeat(1, 2),
            logprobs=torch.zeros(b, 2),
            lengths=torch.full((b,), 2),
            finished=torch.ones(b, dtype=torch.bool),
            policy_version=self.policy_version,
        )

    def update_weights(self, state_dict, policy_version):
        raise AssertionError("not used")


def test_an_engine_without_streaming_releases_everything_at_the_end():
    groups = [[2, 3], [0, 1], [4, 5]]  # rows need not be in order
    eng = _WholeBatchOnly()
    chunks = list(generate_in_groups(eng, [[1]] * 6, SamplingParams(), groups=groups))
    assert [idx for idx, _ in chunks] == [[0], [1], [2]]  # one release per group
    assert chunks[1][1].response_ids[:, 0].tolist() == [0, 1]
    two = list(generate_in_groups(eng, [[1]] * 6, SamplingParams(), groups=groups, min_groups=2))
    assert [idx for idx, _ in two] == [[0, 1], [2]]  # ceil(3 / 2) releases, the last the rest
    assert two[0][1].response_ids[:, 0].tolist() == [2, 3, 0, 1] and two[0][1].policy_version == 5


def test_the_release_count_is_fixed_whatever_finishes_when(tiny):
    """ceil(groups / min_groups) releases: ranks of a data-parallel group that run a forward
    (a collective) per chunk must agree on how many chunks there are."""
    rep, groups = _rows()
    p = SamplingParams(max_new_tokens=9, temperature=1.0)
    eng = _engine(tiny)
    for caps in (_caps(), [9] * len(rep), [1] * len(rep)):  # staggered, all at the cap, at once
        for m, want in ((1, 4), (3, 2), (4, 1), (8, 1)):
            chunks = list(
                eng.generate_streaming(
                    rep, p, groups=groups, min_groups=m, seed=7, max_new_tokens=caps
                )
            )
            assert len(chunks) == want, (caps[0], m)
            assert sorted(g for idx, _ in chunks for g in idx) == [0, 1, 2, 3]
