"""Speculative decoding in the rollout engine (rpeg.perf.generation): a verification of 1 + k
tokens reads the weights and KV once and advances a sequence by the acceptance length."""

from dataclasses import replace

import pytest

from rpeg.perf.calibration import SHIPPED
from rpeg.perf.generation import spec_accept_len
from rpeg.perf.interval import Unknowns, predict_interval
from rpeg.perf.validation import loso
from rpeg.perf.validation.published import read_rows
from rpeg.perf.validation.row_cells import Unpredictable
from rpeg.perf.validation.rows import read_case
from rpeg.perf.validation.solve import solve_row


def _row(case_id, **cells):
    for path in loso.default_datasets().values():
        for r in read_rows(path):
            if r["case_id"] == case_id:
                return {**r, **{k: str(v) for k, v in cells.items()}}
    raise KeyError(case_id)


def _gen(r):
    case = read_case(r)
    case, lay, pred = solve_row(case, SHIPPED)
    return case, lay, pred.stages["generate"]


def test_the_prior_acceptance_length_is_the_geometric_sum_of_the_rate():
    case = read_case(_row("nemo-v0.5-h100bf16-dsv3-grpo-on-256g", spec_decode="mtp"))
    wl = case.workload
    assert wl.spec_draft_tokens == max(1, case.model.mtp_layers) == 1
    r = SHIPPED.spec_accept_rate
    assert spec_accept_len(wl, SHIPPED) == pytest.approx(1 + r)
    assert "spec_accept_len" in case.unknown
    eagle = read_case(_row("nemo-v0.5-h100bf16-llama-grpo-on-16g", spec_decode="eagle"))
    assert spec_accept_len(eagle.workload, SHIPPED) == pytest.approx(1 + r + r**2 + r**3)
    # a published acceptance length is taken as given, within [1, 1 + k]
    assert spec_accept_len(replace(eagle.workload, spec_accept_len=2.2), SHIPPED) == 2.2
    assert spec_accept_len(replace(eagle.workload, spec_accept_len=9.0), SHIPPED) == 4.0


def test_memory_bound_decoding_is_faster_by_the_acceptance_length():
    # one sequence per replica: every decode step streams the weights (memory-bound)
    cells = dict(num_prompts=1, samples_per_prompt=1, gen_tp=8)
    _, lay, plain = _gen(_row("nemo-v0.5-h100bf16-llama-grpo-on-16g", **cells))
    case, _, spec = _gen(
        _row(
            "nemo-v0.5-h100bf16-llama-grpo-on-16g",
            spec_decode="eagle",
            spec_accept_len=2.5,
            **cells,
        )
    )
    decode = lambda s: s.time_s - s.detail["prefill_s"]  # noqa: E731
    layers = case.model.layers
    # faster, by less than the acceptance length: every verification step also carries 3
    # draft passes, each more than a layer's share (its vocabulary projection, its own launch)
    ratio = decode(spec) / decode(plain)
    assert (1 + 3 / layers) / 2.5 < ratio < 1.0
    # the same accepted length bought with more drafts costs more
    _, _, seven = _gen(
        _row(
            "nemo-v0.5-h100bf16-llama-grpo-on-16g",
            spec_decode="eagle",
            spec_draft_tokens=7,
            spec_accept_len=2.5,
            **cells,
        )
    )
    assert decode(seven) > decode(spec)


def test_more_drafts_stop_paying_on_a_rollout_batch():
    # NeMo-RL's speculative rollouts (arXiv 2604.26779: Qwen3-8B on 32 GB200, EAGLE-3) gained
    # 1.77 / 1.44 / 1.21x at 3 / 5 / 7 drafts: past a few drafts each one costs more than the
    # tokens it adds. At the prior acceptance the model's gain falls with k too, and stays a gain
    row = dict(
        model="Qwen3-8B-Base", gpu="GB200", num_gpus=32, gen_gpus="", train_gpus="",
        gpus_per_node=4, gen_tp=1, num_prompts=64, samples_per_prompt=16, max_gen_len=8192,
        avg_gen_len="",
    )  # fmt: skip
    base = "nemo-v0.5-h100bf16-llama-grpo-on-16g"
    plain = _gen(_row(base, **row))[2].time_s
    gains = [
        plain / _gen(_row(base, spec_decode="eagle", spec_draft_tokens=k, **row))[2].time_s
        for k in (3, 5, 7)
    ]
    assert gains[0] > gains[1] > gains[2] > 1.0
    assert gains[0] < 2.0  # not the 2.95x of the acceptance length alone


def test_compute_bound_decoding_gains_nothing_from_drafts():
    # a 1.5B model at 2,048 short live sequences: the matmuls, not the weight reads, set the step;
    # a verification of 4 tokens costs most of 4 steps' work
    from rpeg import specs
    from rpeg.perf.costs import decode_step_time

    cl = specs.cluster("dgx-h100")
    kw = dict(
        context=100.0, tp=1, pp=1, first_device=0, wbytes=2.0, kvbytes=2.0, calib=SHIPPED,
        precision="bf16",
    )  # fmt: skip
    m = specs.model("deepseek-r1-distill-qwen-1.5b")
    big = [decode_step_time(m, cl.gpu, cl, batch=2048, verify=v, **kw)[0] for v in (1, 4)]
    assert big[1] > 1.5 * big[0]  # the verification's matmul work grows with the drafts
    assert big[1] / 1.5 > big[0]  # at an acceptance length of 1.5: slower per token
    one = [decode_step_time(m, cl.gpu, cl, batch=1, verify=v, **kw)[0] for v in (1, 4)]
    assert one[1] < 1.1 * one[0]  # one sequence: memory-bound, the drafts ride along
    assert one[1] / 1.5 < 0.75 * one[0]


def test_an_unknown_acceptance_widens_the_range_and_a_bad_method_is_refused():
    r = _row("nemo-v0.5-h100bf16-dsv3-grpo-on-256g", spec_decode="mtp")
    case, lay, pred = solve_row(read_case(r), SHIPPED)
    args = (case.graph, case.plan(lay), case.workload, SHIPPED)
    lo, hi = predict_interval(*args, Unknowns.of(case.unknown), point=pred.step_s)
    known = tuple(u for u in case.unknown if u != "spec_accept_len")
    lo2, hi2 = predict_interval(*args, Unknowns.of(known), point=pred.step_s)
    assert hi - lo > hi2 - lo2
    with pytest.raises(Unpredictable, match="spec_decode='medusa'; allowed: none, mtp, eagle"):
        read_case({**r, "spec_decode": "medusa"})


def test_an_eager_engine_decodes_slower_where_the_host_bounds_its_steps():
    # one sequence per replica of a 30B-A3B MoE at tp 4 on H20s: each decode step's device
    # work is under its 48 layers' launches, so an engine without CUDA graphs takes longer
    # per token; the prefill is unchanged
    row = _row("verl-fa-30b-colocate-128g", num_prompts=32, samples_per_prompt=1)
    _, _, graphs = _gen({**row, "notes": ""})
    case, _, eager = _gen({**row, "notes": "vLLM gen TP4 enforce_eager"})
    assert case.enforce_eager
    assert eager.detail["prefill_s"] == pytest.approx(graphs.detail["prefill_s"])
    decode = lambda s: s.time_s - s.detail["prefill_s"]  # noqa: E731
    assert decode(eager) > 1.3 * decode(graphs)


#: verl's MTP guide (docs/advance/mtp.md): MiMo-7B, SGLang drafting with the MTP head as a
#: tree of 2 steps x 2 candidates, 4 tokens verified; a rollout of 128 x 16 on 8 GPUs
_MIMO = dict(
    model="mimo-7b", num_gpus=16, gpus_per_node=8, placement="disaggregated", gen_gpus=8,
    train_gpus=8, gen_tp=1, gen_pp="", gen_ep="", train_tp="", train_pp="", train_cp="",
    train_ep="", num_prompts=128, samples_per_prompt=16, max_gen_len=8192, avg_gen_len="",
    max_seq_len="", staleness=0, partial_rollout="no",
)  # fmt: skip
_TREE = (
    "SGLang rollout, MTP: speculative_algorithm=EAGLE speculative_num_steps=2 "
    "speculative_eagle_topk=2 speculative_num_draft_tokens=4"
)


def _mimo(base, gpu, notes, **cells):
    return _gen(_row(base, gpu=gpu, notes=notes, **{**_MIMO, **cells}))


def test_a_draft_tree_verifies_its_width_and_drafts_its_candidates():
    base = "verl-fa-30b-colocate-128g"
    chain = _mimo(base, "h20", _TREE.replace(" speculative_eagle_topk=2", "").replace("=4", "=3"))
    tree = _mimo(base, "h20", _TREE)
    assert (chain[0].workload.spec_verify_tokens, chain[0].workload.spec_topk) == (3, 1)
    assert (tree[0].workload.spec_verify_tokens, tree[0].workload.spec_topk) == (4, 2)
    # the same depth (the same prior acceptance): a wider verification and two candidates a
    # draft pass cost more on a rollout batch
    assert spec_accept_len(tree[0].workload, SHIPPED) == spec_accept_len(chain[0].workload, SHIPPED)
    assert tree[2].time_s > chain[2].time_s
    # a sequence advances by at most the tokens verified
    narrow = replace(
        tree[0].workload, spec_draft_tokens=3, spec_verify_tokens=2, spec_accept_len=3.5
    )
    assert spec_accept_len(narrow, SHIPPED) == 2.0
    with pytest.raises(Unpredictable, match="spec_verify_tokens=9: a draft tree verifies 2 to"):
        read_case(_row(base, notes=_TREE, spec_verify_tokens=9, **_MIMO))
    # the same width in the row's words: the widest tree of 2 steps x 2 candidates (SGLang
    # adjusts the width itself), never a refused row
    worded = read_case(_row(base, notes=_TREE.replace("=4", "=9"), **_MIMO))
    assert worded.workload.spec_verify_tokens == 5


def test_drafts_pay_on_a_compute_rich_gpu_and_not_on_a_compute_poor_one():
    # verl's guide: on H20 (148 dense TFLOPS for 4 TB/s) MTP cut MiMo-7B's rollout throughput
    # by ~50% and it lists H800/H200's 10x the compute: a verification of 4 tokens per
    # sequence is compute-bound on the H20 at a rollout's batch
    base = "verl-fa-30b-colocate-128g"
    gain = {}
    for gpu in ("h20", "h800"):
        plain = _mimo(base, gpu, "SGLang rollout")[2].time_s
        gain[gpu] = plain / _mimo(base, gpu, _TREE)[2].time_s
    assert gain["h20"] < 1.1 < gain["h800"]


def test_sglang_caps_its_running_requests_under_speculative_decoding():
    # SGLang resets max_running_requests to 48 for its speculative workers unless the run sets
    # it; slime does not set it, verl hands SGLang its own max_num_seqs
    slime = "miles-mi300x-qwen3-30b-a3b-8g"
    capped, _, gen = _mimo(slime, "h800", _TREE)
    assert capped.workload.gen_max_seqs == 48 and "gen_max_seqs" in capped.unknown
    lifted, _, gen_lifted = _mimo(slime, "h800", _TREE + " --sglang-max-running-requests 256")
    assert lifted.workload.gen_max_seqs == 256 and "gen_max_seqs" not in lifted.unknown
    assert gen.time_s > 1.2 * gen_lifted.time_s  # 48 sequences a replica starve the rollout
    plain, _, _ = _mimo(slime, "h800", "SGLang rollout")
    assert plain.workload.gen_max_seqs is None  # no drafts: SGLang's own default (memory)
    verl, _, _ = _mimo("verl-fa-30b-colocate-128g", "h800", _TREE)
    assert verl.workload.gen_max_seqs is None
    with pytest.raises(Unpredictable, match="gen_max_seqs=0: must be >= 1"):
        read_case(_row(slime, **{**_MIMO, "gen_max_seqs": 0}))
    # a slip is named, not priced as a sampler reserve no GPU holds
    with pytest.raises(Unpredictable, match="gen_max_seqs=1000000000: at most 65,536"):
        read_case(_row(slime, **{**_MIMO, "gen_max_seqs": "1e9"}))
    said = read_case(_row(slime, **{**_MIMO, "notes": _TREE + " max_running_requests=1000000"}))
    assert said.workload.gen_max_seqs == 48  # words beyond any cap: SGLang's own default
