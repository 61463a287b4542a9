"""A multi-turn sample's turns are seeded by its own identity (run seed, step, its row in the
step's rollout, the turn), never by its position in a turn's batch: the same step's rollout
split into 1, 2 or 3 chunks of prompts (other data-parallel layouts, a recovery on other
ranks) samples the same transcripts. The worker here writes what its row seed says (a
tool call or an answer, numbers from the seed) through the engines' own per-row seeding
(``row_sampling.row_seeds``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rpeg.runtime.data import Example
from rpeg.runtime.engines.base import GenerationOutput, SamplingParams
from rpeg.runtime.engines.row_sampling import (
    TURN_STRIDE,
    rollout_seed,
    row_keys,
    row_seeds,
    turn_seed,
)
from rpeg.runtime.envs.rollout import multiturn_rollout
from rpeg.runtime.tokenizer import build_char_tokenizer

from .scripted import BOS, EOS, PAD, ch, multiturn


class SeededWorker:
    """Row ``i`` of a call writes a function of its row seed only: a tool call
    ``<tool>calc(a*b)</tool>`` or a final answer ``n<eos>``, picked and numbered by the
    row's key (``row_keys``, what the torch engine's sampling streams start from)."""

    def __init__(self) -> None:
        self.tokenizer = build_char_tokenizer()
        self.lm = None
        self.engine = SimpleNamespace(policy_version=0)
        self.seeds: list[list[int]] = []  # per call, the row seeds it was given

    def sampling_params(self, greedy: bool = False) -> SamplingParams:
        return SamplingParams(max_new_tokens=128, temperature=1.0)

    def encode_prompts(self, texts):
        return [[BOS, *ch(t)] for t in texts]

    def generate(self, prompt_ids, params, *, seed=None, max_new_tokens=None):
        seeds = row_seeds(seed, len(prompt_ids))
        self.seeds.append(seeds)
        rows = []
        caps = max_new_tokens or [params.max_new_tokens] * len(seeds)
        for key, cap in zip(row_keys(seeds, len(seeds)).tolist(), caps, strict=True):
            if key % 3:  # two in three: a tool call
                r, eos = ch(f"<tool>calc({2 + key % 7}*{10 + key // 7 % 90})</tool>"), False
            else:
                r, eos = ch(str(key % 1000)) + [EOS], True
            rows.append((r[:cap], eos and len(r) <= cap))
        width = max(len(r) for r, _ in rows)
        ids = torch.full((len(rows), width), PAD, dtype=torch.long)
        for j, (r, _) in enumerate(rows):
            ids[j, : len(r)] = torch.tensor(r)
        return GenerationOutput(
            response_ids=ids,
            logprobs=torch.full((len(rows), width), -0.5),
            lengths=torch.tensor([len(r) for r, _ in rows]),
            finished=torch.tensor([f for _, f in rows]),
        )


EXAMPLES = [Example(f"q{i}", "84") for i in range(3)]
K = 2  # samples per prompt: 6 rows
RUN_SEED, STEP = 3, 2  # the old seeding gave other transcripts on 2 and on 3 chunks here


def _chunked(parts: list[int]) -> tuple[list[list[int]], list[str], list[int], SeededWorker]:
    """The step's rollout in chunks of ``parts`` prompts each (rows numbered from each
    chunk's first row, seeded as the distributed runtime seeds a rank's part)."""
    w = SeededWorker()
    ids, texts, index = [], [], []
    first = 0
    for n in parts:
        exs = EXAMPLES[first : first + n]
        row = first * K
        b, _ = multiturn_rollout(
            w,
            exs,
            K,
            multiturn(max_turns=3, max_turn_tokens=40),
            seed=rollout_seed(RUN_SEED, STEP, row),
            first_row=row,
        )
        for i in range(b.response_ids.shape[0]):
            ids.append(b.response_ids[i][b.response_attention[i].bool()].tolist())
        texts += b.responses
        index += b.sample_index.tolist()
        first += n
    return ids, texts, index, w


def test_turn_seed_by_hand():
    # row seed 5: turn 0 is the row seed, turn t is 5 + t * 2**55
    assert TURN_STRIDE == 2**55
    assert turn_seed(5, 0) == 5
    assert turn_seed(5, 1) == 36028797018963973  # 5 + 2**55
    assert turn_seed(5, 2) == 72057594037927941  # 5 + 2**56
    # modulo the seed space 2**62
    assert turn_seed(2**62 - 1, 128) == 2**62 - 1  # 128 * 2**55 = 2**62
    with pytest.raises(ValueError, match="turn"):
        turn_seed(5, -1)
    assert row_seeds(10, 3) == [10, 11, 12]
    assert row_seeds([4, 9], 2) == [4, 9]
    with pytest.raises(ValueError, match="2 row seeds for 3 rows"):
        row_seeds([4, 9], 3)


def test_engine_keys_from_per_row_seeds_equal_consecutive_ones():
    # [seed, seed + 1, seed + 2] as a list: the keys an int seed gives the same rows
    assert row_keys([100, 101, 102], 3).tolist() == row_keys(100, 3).tolist()
    assert row_keys([102], 1).tolist() == row_keys(100, 3)[2:].tolist()


def test_one_two_and_three_chunks_sample_the_same_transcripts():
    ids1, texts1, idx1, w1 = _chunked([3])
    ids2, texts2, idx2, _ = _chunked([2, 1])
    ids3, texts3, idx3, _ = _chunked([1, 1, 1])
    assert idx1 == idx2 == idx3 == list(range(6))
    assert texts1 == texts2 == texts3
    assert ids1 == ids2 == ids3
    # the case the old seeding got wrong: some rows finished in turn 1 and others went on
    # (a later turn's batch is a subset of rows), and some took three turns
    assert [len(x) for x in w1.seeds] == [6, 5, 3]
    # every row's turn t was seeded rollout_seed(run, step, 0) + row + t * 2**55, by hand
    base = rollout_seed(RUN_SEED, STEP)  # ((3 * 1_000_003 + 2) * 2**24) % 2**62
    assert base == (3 * 1_000_003 + 2) * 2**24
    assert w1.seeds[0] == [base + r for r in range(6)]
    alive = [r for r in range(6) if texts1[r].count("<result>") >= 1]
    assert w1.seeds[1] == [base + r + 2**55 for r in alive]
    alive2 = [r for r in range(6) if texts1[r].count("<result>") >= 2]
    assert w1.seeds[2] == [base + r + 2**56 for r in alive2]
