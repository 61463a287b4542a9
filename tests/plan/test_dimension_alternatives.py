"""The report's best pp and cp alternatives (rpeg.search.optimizer.dimension_alternatives): the
best plan of the chosen structure and placement whose training units run at pp > 1 / cp > 1,
priced as the search prices, with its time against the chosen plan -- or, where none is
feasible, its training layouts' rejections counted by reason."""

import io

import pytest
from rich.console import Console

from rpeg.search.optimizer import dimension_alternatives, optimize_problem
from rpeg.search.report import render
from rpeg.search.space import SpaceOptions
from tests.plan.conftest import gh200_problem

SPACE = SpaceOptions(
    max_staleness=0,
    tp=(1, 2, 4),
    pp=(1, 2, 4),
    cp=(1, 2),
    cp_min_seq_tokens=4096,
    micro_batch_sizes=(1,),
    recompute=(True,),
    engines=("auto", "fsdp"),
    gen_pp=(1,),
    fusions=("none",),
    offload=(False,),
    streaming=(False,),
)


@pytest.mark.parametrize("gpus,model", [(16, "qwen2.5-7b"), (64, "qwen2.5-1.5b")])
def test_best_pp_and_cp_alternatives_beside_the_chosen_plan(gpus, model):
    prob = gh200_problem(gpus=gpus, k=0, model=model)
    res = optimize_problem(prob, space_options=SPACE, baselines=False)
    assert set(res.dimensions) == {"pp", "cp"}
    d = res.to_dict()["dimensions"]
    for dim, alt in res.dimensions.items():
        if alt.chosen:
            assert any(getattr(lay, dim) > 1 for lay in res.best.layouts.values())
        elif alt.candidate is not None:
            c = alt.candidate
            # the same cell, its training units at dim > 1, never faster than the chosen plan
            # (a faster one becomes the chosen plan)
            assert (c.structure, c.placement) == (res.best.structure, res.best.placement)
            train = [n for n, s in c.prediction.stages.items() if "train_actor" in s.kinds]
            assert train and all(getattr(c.layouts[n], dim) > 1 for n in train)
            assert c.step_s >= res.best.step_s * (1 - 1e-9)
            assert d[dim]["vs_chosen"] >= 1 - 1e-9 and d[dim]["why_lost"]
        else:  # e.g. the runtime's cp keeps dp replicas: its refusals counted by reason
            assert alt.reason.startswith("every training layout rejected")
            assert sum(alt.rejected.values()) > 0 and d[dim]["predicted_step_s"] is None
    out = io.StringIO()
    render(res, console=Console(file=out, width=200))
    assert "best plan training at pp > 1 / cp > 1" in out.getvalue()


def test_a_faster_plan_found_with_pp_held_becomes_the_chosen_plan():
    """At 64 GH200s for the 1.5B model the cell's solve with the trainer held at pp > 1
    finds a faster plan than the search's assembly did: it is the chosen plan."""
    prob = gh200_problem(gpus=64, k=0, model="qwen2.5-1.5b")
    res = optimize_problem(prob, space_options=SPACE, baselines=False)
    assert res.dimensions["pp"].chosen


def test_cp_is_not_searched_for_short_sequences():
    prob = gh200_problem(gpus=8, k=0)
    res = optimize_problem(
        prob, space_options=SPACE.restrict(cp_min_seq_tokens=1 << 20), baselines=False
    )
    cp = dimension_alternatives(
        prob, res.best, space_options=SPACE.restrict(cp_min_seq_tokens=1 << 20)
    )["cp"]
    assert cp.candidate is None and "cp_min_seq_tokens" in cp.reason
