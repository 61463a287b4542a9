"""Sequence packing (rpeg.runtime.packing, UnitPlan.seq_packing): a micro-batch's rows run end
to end as one row without padding, and every pass gives what the padded micro-batch gives."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.micro_batches import plan_micro_batches
from rpeg.runtime.packing import pack, packed_forward, rows_of


@dataclass
class Cut:
    """What a compiled unit tells a role about its micro-batches."""

    micro_batch_size: int = 8
    max_tokens_per_micro_batch: int | None = None
    seq_packing: bool = False


def _hand_batch() -> RolloutBatch:
    """Row 0: prompt [5, 6] (left-padded to 3), response [7, 8]; row 1: prompt [1, 2, 3],
    response [4]."""
    return RolloutBatch(
        prompt_ids=torch.tensor([[0, 5, 6], [1, 2, 3]]),
        prompt_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]),
        response_ids=torch.tensor([[7, 8, 0], [4, 0, 0]]),
        response_mask=torch.tensor([[1, 1, 0], [1, 0, 0]]),
        sample_logprobs=torch.zeros(2, 3),
        policy_version=torch.zeros(2, dtype=torch.long),
        group_ids=torch.arange(2),
    )


def test_pack_lays_the_attended_tokens_end_to_end_and_unpack_restores_the_layout():
    b = _hand_batch()
    pk = pack(b.input_ids, b.attention_mask, b.position_ids, b.response_ids, b.response_mask)
    assert pk.input_ids.tolist() == [[5, 6, 7, 8, 1, 2, 3, 4]]
    assert pk.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert pk.labels.tolist() == [[7, 8, 4]]
    # token 6 predicts 7, token 7 predicts 8, token 3 predicts 4; then the last position
    assert pk.keep.tolist() == [1, 2, 6, 7]
    assert pk.lengths == (4, 4)
    out = pk.unpack(torch.tensor([[10.0, 20.0, 30.0]]))
    assert out.tolist() == [[10.0, 20.0, 0.0], [30.0, 0.0, 0.0]]
    # any per-position tensor of the padded layout moves into the packed row and back
    pos = torch.arange(12).reshape(1, 12, 1)  # [layers, b * (P + R), k]
    assert pk.tokens(pos, dim=1).flatten().tolist() == [1, 2, 3, 4, 6, 7, 8, 9]
    back = pk.padded(pk.tokens(pos, dim=1), dim=1).flatten().tolist()
    assert back == [0, 1, 2, 3, 4, 0, 6, 7, 8, 9, 0, 0]


def test_rows_of_indexes_each_sequence_right_padded_with_its_last_token():
    rows = rows_of([2, 3])
    assert rows.index.tolist() == [[0, 1, 1], [2, 3, 4]]
    assert rows.valid.tolist() == [[True, True, False], [True, True, True]]


def test_a_packed_token_budget_counts_real_tokens_not_padded_rows():
    """Rows of 2 + 10, 2 + 1, 2 + 1, 2 + 1 tokens, budget 24: padded, the long row and one
    short one fill 2 x 12 = 24 and the other two take a second micro-batch; packed, all four
    (21 tokens) fit one."""
    r = torch.tensor([10, 1, 1, 1])
    batch = RolloutBatch(
        prompt_ids=torch.ones(4, 2, dtype=torch.long),
        prompt_mask=torch.ones(4, 2, dtype=torch.long),
        response_ids=torch.ones(4, 10, dtype=torch.long),
        response_mask=(torch.arange(10)[None] < r[:, None]).long(),
        sample_logprobs=torch.zeros(4, 10),
        policy_version=torch.zeros(4, dtype=torch.long),
        group_ids=torch.arange(4),
    )
    assert plan_micro_batches(batch, 4, 24) == [[0, 1], [2, 3]]
    assert plan_micro_batches(batch, 4, 24, packed=True) == [[0, 1, 2, 3]]
    assert plan_micro_batches(batch, 4, 20, packed=True) == [[0, 1, 2], [3]]


def _worker(tiny, **kw):
    from rpeg.config import RunConfig
    from rpeg.runtime import stages
    from rpeg.runtime.data import ArithmeticSource
    from rpeg.runtime.roles import PolicyWorker

    cfg = RunConfig().with_overrides(
        {"workload.max_response_tokens": 12, "workload.micro_batch_size": 8}
    )
    model, tok = tiny
    w = PolicyWorker(
        copy.deepcopy(model),
        tok,
        algorithm=cfg.algorithm,
        optim=cfg.optim,
        workload=cfg.workload,
        **kw,
    )
    exs = [ArithmeticSource(1)[i] for i in range(4)]
    batch, _ = stages.generate_stage(w, exs, 4, seed=0)
    return w, batch


def test_packed_log_probs_entropy_and_gradients_equal_the_padded_ones(tiny):
    w, batch = _worker(tiny)
    lengths = batch.response_mask.sum(-1)
    assert lengths.min() < lengths.max()  # rows of different lengths: padding to remove
    w.micro_batching = Cut()
    lp, ent = w.compute_logprobs(batch, with_entropy=True)
    for cut in (Cut(seq_packing=True), Cut(max_tokens_per_micro_batch=100, seq_packing=True)):
        w.micro_batching = cut
        plp, pent = w.compute_logprobs(batch, with_entropy=True)
        torch.testing.assert_close(plp, lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(pent, ent, atol=1e-5, rtol=0)
    assert w.lm.config._attn_implementation == "rpeg_packed_sdpa"
    # a padded pass after a packed one runs the model's own attention, unchanged
    w.micro_batching = Cut()
    torch.testing.assert_close(w.compute_logprobs(batch), lp, atol=0, rtol=0)
    grads = []
    for cut in (Cut(), Cut(seq_packing=True)):
        w.micro_batching = cut
        w.lm.zero_grad()
        out, _, _ = w._forward(batch, 1.0)
        (out * batch.response_mask).sum().backward()
        grads.append([p.grad.clone() for p in w.lm.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_packed_values_equal_the_padded_ones_for_a_critic_and_a_shared_head(tiny):
    from rpeg.config import RunConfig
    from rpeg.runtime.critic import CriticWorker

    w, batch = _worker(tiny, value_head=True)
    outs = []
    for cut in (Cut(), Cut(seq_packing=True)):
        w.micro_batching = cut
        outs.append(w.compute_logprobs_and_values(batch))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    cfg = RunConfig()
    critic = CriticWorker(
        copy.deepcopy(tiny[0]), algorithm=cfg.algorithm, optim=cfg.optim, workload=cfg.workload
    )
    values = []
    for cut in (Cut(), Cut(seq_packing=True)):
        critic.micro_batching = cut
        values.append(critic.compute_values(batch))
    torch.testing.assert_close(values[1], values[0], atol=1e-5, rtol=0)


def test_a_packed_forward_keeps_each_sequence_to_itself(tiny):
    """The hidden states of a sequence packed after another equal those of it alone."""
    model = copy.deepcopy(tiny[0])
    a, b = torch.tensor([[3, 4, 5, 6, 7]]), torch.tensor([[8, 9, 10]])
    alone = model.model(input_ids=b, position_ids=torch.arange(3)[None]).last_hidden_state
    ids = torch.cat([a, b], dim=1)
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    mask = torch.ones_like(ids)
    pk = pack(ids, mask, pos, ids[:, 1:], torch.ones(1, 7, dtype=torch.long))
    pk = type(pk)(**{**pk.__dict__, "lengths": (5, 3)})  # two sequences, not one row
    with packed_forward(model, pk) as kw:
        out = model.model(input_ids=ids, position_ids=pos, **kw).last_hidden_state
    torch.testing.assert_close(out[:, 5:], alone, atol=1e-5, rtol=0)
    crossed = model.model(input_ids=ids, position_ids=pos, attention_mask=mask).last_hidden_state
    assert (crossed[:, 5:] - alone).abs().max() > 1e-3  # without packing they would mix


@pytest.mark.parametrize("recompute", [False, True])
def test_packed_routing_replay_routes_and_learns_as_the_padded_forward(recompute):
    """A mixture-of-experts policy replaying its rollout's experts: packed, every response
    token routes as recorded (mismatch 0, as padded), the routers' own choices and the
    gradients are the padded forward's -- with activation checkpointing too."""
    from transformers import AutoModelForCausalLM

    from rpeg.config import AlgorithmConfig
    from rpeg.runtime.roles import PolicyWorker
    from rpeg.runtime.unit_memory import apply_recompute
    from tests.runtime.models.tiny_folders import replay_rollout, tiny_hf_config

    tok = SimpleNamespace(pad_token_id=0, eos_token_id=99)
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(tiny_hf_config("qwen3_moe"))
    if recompute:
        assert apply_recompute(lm)
    w = PolicyWorker(lm, tok, algorithm=AlgorithmConfig(routing_replay="rollout"))
    batch = replay_rollout(w, [[5, 6, 7], [8, 9], [10, 11, 12, 13]], 6)
    lm.train()
    stats, grads, lps = [], [], []
    for cut in (Cut(), Cut(seq_packing=True)):
        w.micro_batching = cut
        lm.zero_grad()
        lp, _, _ = w._forward(batch, 1.0)
        (lp * batch.response_mask).sum().backward()
        stats.append(dict(w._route_stats))
        lps.append(lp.detach())
        grads.append([p.grad.clone() for p in lm.parameters() if p.grad is not None])
    assert stats[0]["routing_mismatch"] == stats[1]["routing_mismatch"] == 0.0
    assert stats[1]["routing_mismatch_unreplayed"] == stats[0]["routing_mismatch_unreplayed"] > 0.1
    torch.testing.assert_close(lps[1] * batch.response_mask, lps[0] * batch.response_mask)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def _ragged_batch(seed: int = 0) -> RolloutBatch:
    """Three rows: prompts of 3, 5, 2 tokens (left-padded), responses of 4, 1, 6."""
    g = torch.Generator().manual_seed(seed)
    p_len, r_len = torch.tensor([3, 5, 2]), torch.tensor([4, 1, 6])
    pmask = (torch.arange(5)[None] >= 5 - p_len[:, None]).long()
    rmask = (torch.arange(6)[None] < r_len[:, None]).long()
    return RolloutBatch(
        prompt_ids=torch.randint(5, 90, (3, 5), generator=g) * pmask,
        prompt_mask=pmask,
        response_ids=torch.randint(5, 90, (3, 6), generator=g) * rmask,
        response_mask=rmask,
        sample_logprobs=torch.zeros(3, 6),
        policy_version=torch.zeros(3, dtype=torch.long),
        group_ids=torch.arange(3),
    )


@pytest.mark.parametrize(
    "model_type",
    ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gpt_oss", "gemma3_text", "olmo2"],
)
def test_every_attention_family_gives_the_padded_log_probs_packed(model_type):
    """Sliding-window layers (gemma3, gpt-oss, window 16 over 11-token rows: set to 3 here so
    it cuts), attention sinks and an eager base (gpt-oss) included."""
    from transformers import AutoModelForCausalLM

    from rpeg.runtime.roles import PolicyWorker
    from tests.runtime.models.tiny_folders import tiny_hf_config

    over = {"sliding_window": 3} if model_type in ("gemma3_text", "gpt_oss") else {}
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(tiny_hf_config(model_type, **over))
    w = PolicyWorker(lm, SimpleNamespace(pad_token_id=0, eos_token_id=99))
    batch = _ragged_batch()
    w.micro_batching = Cut()
    padded = w.compute_logprobs(batch)
    w.micro_batching = Cut(seq_packing=True)
    torch.testing.assert_close(w.compute_logprobs(batch), padded, atol=2e-5, rtol=0)
    assert lm.config._attn_implementation.startswith("rpeg_packed_")


def test_a_linear_attention_model_is_not_packed_and_packing_it_is_refused_by_name():
    """Qwen3-Next's gated delta-net layers carry a recurrent state along the row: ``auto``
    compiles its units padded, an explicit ``true`` is refused, and a rank handed a packed
    unit for it anyway says why."""
    from transformers import AutoModelForCausalLM

    from rpeg import specs
    from rpeg.compile.checks import packing_problems
    from rpeg.plan.schema import Plan, UnitPlan
    from rpeg.runtime.roles import PolicyWorker
    from tests.runtime.models.tiny_folders import tiny_hf_config

    spec = specs.model("qwen3-next-80b-a3b")
    assert spec.linear_attn is not None
    unit = UnitPlan(devices="0")
    assert unit.packs() and not unit.packs(spec)
    plan = Plan(
        cluster="local-cpu",
        model=spec.name,
        units={"train_actor": unit.model_copy(update={"seq_packing": True})},
    )
    (problem,) = packing_problems(plan, spec)
    assert (
        problem.where == "plan.units.train_actor.seq_packing" and "linear-attention" in problem.what
    )
    lm = AutoModelForCausalLM.from_config(tiny_hf_config("qwen3_next"))
    w = PolicyWorker(lm, SimpleNamespace(pad_token_id=0, eos_token_id=99))
    w.micro_batching = Cut(seq_packing=True)
    with pytest.raises(ValueError, match="linear_attention layers carry state.*seq_packing: false"):
        w.compute_logprobs(_ragged_batch())


def test_a_multi_turn_transcript_packs_every_attended_token_and_keeps_the_loss_mask(tiny):
    """A transcript attends to the environment's tokens too (``response_attention``) while
    its loss mask is the model's own: packed, every attended position gets the padded
    log-prob, the environment's tokens included."""
    from rpeg.runtime.roles import PolicyWorker

    batch = _ragged_batch()
    att = batch.response_mask.clone()
    loss = att.clone()
    loss[0, 1:3] = 0  # row 0: tokens 1-2 are the environment's
    batch = batch.replace(response_mask=loss, response_attention=att)
    w = PolicyWorker(copy.deepcopy(tiny[0]), tiny[1])
    w.micro_batching = Cut()
    padded, _, _ = w._forward(batch, 1.0)
    w.micro_batching = Cut(seq_packing=True)
    packed, _, _ = w._forward(batch, 1.0)
    torch.testing.assert_close(packed * att, padded * att, atol=1e-5, rtol=0)
    assert bool((packed[0, 1:3] != 0).all())  # scored, though the loss will not count them
