"""Baselines are feasible, priced by the same model, and shaped as documented."""

import pytest

from rpeg.perf import predict_plan
from rpeg.search.optimizer import SearchOptions, optimize_problem
from tests.plan.conftest import gh200_problem


@pytest.fixture(scope="module")
def result():
    return optimize_problem(
        gh200_problem(gpus=16, algo="ppo", k=1), options=SearchOptions(mode="decompose")
    )


def test_every_baseline_is_priced(result):
    for name in ("verl", "real", "areal", "best_sync", "best_colocated", "no_share_no_fusion"):
        b = result.baselines[name]
        assert b.candidate is not None, (name, b.reason)
        pred = predict_plan(b.candidate.plan, result.problem.workload)
        assert pred.step_s == pytest.approx(b.candidate.step_s, rel=1e-9)
        # the optimizer's space contains every baseline: none may beat it
        assert b.candidate.step_s >= result.best.step_s * (1 - 1e-9)


def test_baseline_shapes(result):
    verl = result.baselines["verl"].candidate
    assert verl.structure.staleness == 0 and verl.placement.colocated and verl.placement.offload
    tps = {u.tp for u in verl.plan.units.values() if u.tp > 1}
    assert len(tps) <= 1  # one layout for every role
    assert all(u.num_devices == 16 for u in verl.plan.units.values())
    real = result.baselines["real"].candidate
    assert real.structure.staleness == 0 and real.placement.colocated
    areal = result.baselines["areal"].candidate
    assert areal.placement.gen_devices == 12 and areal.structure.staleness >= 1
    assert areal.plan.partial_rollout
    assert result.baselines["best_sync"].candidate.structure.staleness == 0
    nsf = result.baselines["no_share_no_fusion"].candidate.structure
    assert not nsf.share_actor_critic and nsf.fusion == "none"


def test_to_dict_has_speedups(result):
    d = result.to_dict()
    assert d["baselines"]["verl"]["speedup"] >= 1.0
    reasons = {r for r in d["counts"]["infeasible"] if not r.startswith("runtime: ")}
    assert reasons <= {"memory", "devices", "divisibility"}
