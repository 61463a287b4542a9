"""Pipeline parallelism (rpeg.runtime.pipeline): the schedules' orders, the layer split, the
bubble, refusals by name; on spawned gloo ranks (slow) pp=2 under 1F1B, interleaved 1F1B and
GPipe, and pp=2 x dp=2, each equal to one process (loss, log-probs, gradients, weights) on the
built-in tiny model widened to 8 layers."""

from __future__ import annotations

import pytest
import torch

from rpeg.errors import ConfigError
from rpeg.runtime.pipeline import (
    PP_SCHEDULES,
    Action,
    PipeLayout,
    bubble_fraction,
    check_orders,
    chunks_per_rank,
    pipeline_problems,
    schedule_orders,
    split_layers,
)

TOL = 1e-5
LR = 1e-3  # optim.lr of sharding_cases.config
KEYS = ("pg_loss", "kl", "entropy")


# --- pure: orders, split, bubble -----------------------------------------------------------
@pytest.mark.parametrize("schedule", PP_SCHEDULES)
@pytest.mark.parametrize("pp", [2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
def test_every_schedule_runs_each_chunk_once_without_deadlock(schedule, pp, m):
    orders = schedule_orders(schedule, pp, m)
    chunks = pp * chunks_per_rank(schedule)
    check_orders(orders, chunks, m)  # raises on a deadlock, a missing or a repeated action


def test_one_f_one_b_keeps_at_most_pp_minus_rank_micro_batches_in_flight():
    pp, m = 4, 8
    for r, order in enumerate(schedule_orders("1f1b", pp, m)):
        live = peak = 0
        for a in order:
            live += 1 if a.kind == "F" else -1
            peak = max(peak, live)
        assert peak == pp - r  # GPipe would hold all m
    gpipe = schedule_orders("gpipe", pp, m)[0]
    assert [a.kind for a in gpipe] == ["F"] * m + ["B"] * m


def test_interleaved_rank_holds_chunks_r_and_r_plus_pp():
    orders = schedule_orders("interleaved_1f1b", 2, 4)
    assert {a.chunk for a in orders[0]} == {0, 2}
    assert {a.chunk for a in orders[1]} == {1, 3}
    # rank 0's first forwards: micro-batches 0, 1 through chunk 0, then through chunk 2
    assert orders[0][:4] == [
        Action("F", 0, 0),
        Action("F", 0, 1),
        Action("F", 2, 0),
        Action("F", 2, 1),
    ]


def test_check_orders_names_a_deadlock():
    # rank 1 waits for a backward of chunk 0 it must send itself first: never happens
    bad = [
        [Action("F", 0, 0), Action("B", 0, 0)],
        [Action("B", 1, 0), Action("F", 1, 0)],
    ]
    with pytest.raises(ValueError, match="deadlocks"):
        check_orders(bad, 2, 1)
    with pytest.raises(ValueError, match="once"):
        check_orders([[Action("F", 0, 0)], [Action("F", 1, 0)]], 2, 1)


def test_split_layers_contiguous_last_chunk_not_larger():
    assert split_layers(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert split_layers(7, 2) == [range(0, 4), range(4, 7)]
    with pytest.raises(ValueError):
        split_layers(3, 4)


def test_bubble_matches_one_f_one_b_and_interleaved_formulas():
    assert bubble_fraction("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction("gpipe", 4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction("interleaved_1f1b", 4, 8) == pytest.approx(3 / 19)
    assert bubble_fraction("1f1b", 1, 8) == 0.0


def test_bubble_equals_the_idle_slots_of_the_replayed_schedule():
    """The formula is the replay's idle share when every action takes one slot per chunk
    (forward and backward alike): rounds x chunk-time vs the busy time of a rank."""
    for schedule in ("1f1b", "interleaved_1f1b"):
        pp, m = 4, 8
        v = chunks_per_rank(schedule)
        rounds = check_orders(schedule_orders(schedule, pp, m), pp * v, m)
        busy = 2 * m * v  # slots of one rank
        # forward sweep and backward sweep each add pp - 1 slots of fill / drain
        assert rounds == busy + 2 * (pp - 1)
        assert 1 - busy / rounds == pytest.approx(bubble_fraction(schedule, pp, m))


def test_unknown_schedule_and_too_few_layers_refused_by_name():
    with pytest.raises(ConfigError, match="pp_schedule.*allowed: 1f1b, interleaved_1f1b, gpipe"):
        chunks_per_rank("zero_bubble")
    p = pipeline_problems(4, 4, "interleaved_1f1b", where="plan.units.train")
    assert p and p[0].where == "plan.units.train.pp" and "at least 8 decoder layers" in p[0].what
    assert pipeline_problems(8, 4, "interleaved_1f1b") == []


def test_pipe_layout_places_tp_innermost_then_pp_then_dp():
    lay = PipeLayout(pp=2, dp=2, tp=2)
    assert lay.world_size == 8
    assert lay.pp_ranks(5) == [5, 7] and lay.dp_ranks(5) == [1, 5] and lay.tp_ranks(5) == [4, 5]
    assert (lay.dp_index(5), lay.pp_index(5), lay.tp_index(5)) == (1, 0, 1)


# --- spawned gloo ranks ----------------------------------------------------------------------
def _name(k: str) -> str:
    # the last rank's copy of the tied LM head is the embedding of the one process
    return "model.embed_tokens.weight" if k == "lm_head.weight" else k


def _check_rank(ref: dict, out: dict, loss_of=None, tiny_grads_free: bool = False) -> None:
    torch.testing.assert_close(out["logprobs"], ref["logprobs"], atol=TOL, rtol=0)
    if loss_of is None:
        for k in KEYS:
            assert out["metrics"][k] == pytest.approx(ref["metrics"][k], abs=TOL), k
    assert out["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], abs=TOL)
    for k, g in out["grads"].items():
        torch.testing.assert_close(g, ref["grads"][_name(k)], atol=TOL, rtol=0, msg=k)
    for k, v in out["weights"].items():
        diff = (v - ref["weights"][_name(k)]).abs()
        if tiny_grads_free and k in out["grads"]:
            # AdamW's first step moves a weight by lr * g / (|g| + 1e-8): where |g| ~ 1e-8
            # the round-off of tp's partial sums moves it by a visible share of lr
            g = ref["grads"][_name(k)].abs()
            small = diff[g <= 1e-6]
            assert small.numel() == 0 or float(small.max()) <= 2 * LR, k
            diff = diff[g > 1e-6]
        d = float(diff.max()) if diff.numel() else 0.0
        assert d <= TOL, f"{k}: weights differ by {d:.3g}"


def _check_cover(ref: dict, res: dict) -> None:
    """The ranks' parameters together are the whole model's, each layer on one stage."""
    held = {_name(k) for out in res.values() for k in out["grads"]}
    assert held == set(ref["grads"])
    stages = {tuple(out["layers"]) for out in res.values() if out["dp_index"] == 0}
    assert len(stages) == 2  # tp ranks of a stage hold the same layers
    assert sorted(i for st in stages for i in st) == list(range(8))


@pytest.fixture(scope="module")
def ref():
    import pipeline_cases as C

    return C.reference(C.config())


@pytest.mark.slow  # two spawned ranks, three schedules: ~1 min on 2 shared cores
def test_pp2_schedules_equal_single_process(ref):
    import pipeline_cases as C

    cfg = C.config()
    # token budgets: 20 -> 6 micro-batches of 1-2 rows and 8-12 columns; 36 -> 3 (not a
    # multiple of pp: interleaving's last group is short)
    budgets = {n: C.config(**{"workload.max_tokens_per_micro_batch": n}) for n in (20, 36)}
    cases = [(s, "pipeline_case", (cfg, 2, 1, s)) for s in PP_SCHEDULES]
    cases += [
        (f"budget{n}", "pipeline_case", (c, 2, 1, "interleaved_1f1b")) for n, c in budgets.items()
    ]
    out = C.spawn(2, cases, port=29841)
    for s in PP_SCHEDULES:
        res = out[s]
        _check_cover(ref, res)
        assert res[0]["layers"] == ([0, 1, 2, 3] if s != "interleaved_1f1b" else [0, 1, 4, 5])
        for r in res:
            _check_rank(ref, res[r])
    for n, c in budgets.items():
        ref_budget = C.reference(c)
        for res in out[f"budget{n}"].values():
            _check_rank(ref_budget, res)


@pytest.mark.slow  # four spawned ranks
def test_pp2_x_dp2_equals_single_process(ref):
    import pipeline_cases as C

    cfg = C.config()
    out = C.spawn(4, [("pp_dp", "pipeline_case", (cfg, 2, 2, "1f1b"))], port=29861)["pp_dp"]
    _check_cover(ref, out)
    # each dp index's loss metrics are its share of the global mini-batch: their mean is it
    for k in KEYS:
        mean = sum(out[r]["metrics"][k] for r in (0, 2)) / 2
        assert mean == pytest.approx(ref["metrics"][k], abs=TOL), k
    for res in out.values():
        rows = C.S.rows_of(res["dp_index"], 2)
        mine = {**ref, "logprobs": ref["logprobs"][rows]}
        # dp's sum of the two halves' gradients reorders the reduction as tp's partial sums
        # do: a weight whose gradient is ~1e-8 moves by a round-off-sized share of lr
        # (measured: one v_proj element, gradient 8.97e-9 vs 8.26e-9, weights 2.05e-5 apart)
        _check_rank(mine, res, loss_of="dp", tiny_grads_free=True)


@pytest.mark.slow  # two spawned ranks
def test_pp2_built_on_meta_holds_its_stage_and_gathers_the_whole_model(ref):
    import pipeline_cases as C

    out = C.spawn(2, [("meta", "meta_case", (C.config(),))], port=29881)["meta"]
    _check_cover(ref, out)
    for res in out.values():
        # 8 layers over 2 stages; the tied embedding is held on both ends
        assert res["held"] < 0.6 * res["full_bytes"]
        assert res["gathered_ok"]
        _check_rank(ref, res)


@pytest.mark.slow  # two spawned ranks, two layouts
def test_checkpoint_at_dp2_resumes_at_pp2(tmp_path):
    import pipeline_cases as C

    cfg = C.config()
    ref = C.reference_steps(cfg, 2)
    url = str(tmp_path / "ckpt")
    out = C.spawn(2, [("resume", "resume_case", (cfg, url))], port=29903, timeout_s=200)["resume"]
    for res in out.values():
        assert res["version"] == 2
        for k in KEYS:
            assert res["metrics"][k] == pytest.approx(ref[1][k], abs=1e-4), k
        assert res["metrics"]["grad_norm"] == pytest.approx(ref[1]["grad_norm"], rel=1e-4)


@pytest.mark.slow  # four spawned ranks
def test_tp2_x_pp2_equals_single_process(ref):
    import pipeline_cases as C

    cfg = C.config()
    out = C.spawn(4, [("tp_pp", "pipeline_case", (cfg, 2, 1, "1f1b", 2))], port=29921)["tp_pp"]
    _check_cover(ref, out)
    for res in out.values():
        assert any(k.endswith("q_proj.weight") for k in res["tp_sharded"])  # really split
        # gradients at 1e-5; weights after AdamW at 1e-5 except where a gradient is ~0
        _check_rank(ref, res, tiny_grads_free=True)


def _tiny(layers: int = 4):
    from rpeg.runtime.model_io import create_tiny

    return create_tiny(seed=0, num_hidden_layers=layers, hidden_size=32, intermediate_size=64)


def test_stages_keep_their_layers_embedding_and_head_under_the_model_names():
    from rpeg.runtime.pipeline import Pipeline

    first = Pipeline(_tiny()[0], 0, [0, 1], None, "1f1b")
    last = Pipeline(_tiny()[0], 1, [0, 1], None, "1f1b")
    names0, names1 = set(first.lm.state_dict()), set(last.lm.state_dict())
    assert first.owned_layers() == [0, 1] and last.owned_layers() == [2, 3]
    assert "model.embed_tokens.weight" in names0 and "model.norm.weight" not in names0
    assert not any(n.startswith(("model.layers.2.", "model.layers.3.")) for n in names0)
    assert "model.embed_tokens.weight" not in names1 and "model.norm.weight" in names1
    assert "model.layers.3.mlp.up_proj.weight" in names1
    # the last rank's tied head is its own copy, equal to the embedding
    whole = _tiny()[0]
    torch.testing.assert_close(last.lm.lm_head.weight, whole.model.embed_tokens.weight)
    assert last.tied_params() == [last.lm.lm_head.weight]
    with pytest.raises(RuntimeError, match="only inside its pipeline schedule"):
        last.lm(input_ids=torch.ones(1, 3, dtype=torch.long))


def test_pipelined_roles_refuse_what_they_do_not_run_by_name():
    from rpeg.runtime.pipeline import apply_pipeline
    from rpeg.runtime.roles import PolicyWorker

    m, tok = _tiny()
    w = PolicyWorker(m, tok, value_head=True)
    with pytest.raises(ConfigError, match="algorithm.share_actor_critic"):
        apply_pipeline(w, PipeLayout(pp=2), 0, {"pp": None, "dp": None})
    m, tok = _tiny()
    w = PolicyWorker(m, tok, compute_dtype=torch.float16)
    with pytest.raises(ConfigError, match="workload.precision.*allowed: fp32, bf16"):
        apply_pipeline(w, PipeLayout(pp=2), 0, {"pp": None, "dp": None})
