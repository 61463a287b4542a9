"""The search space: enumeration counts and rejection reasons."""

from rpeg.search.evaluate import Evaluator
from rpeg.search.optimizer import space_size
from rpeg.search.problem import search_space
from rpeg.search.space import Layout, SpaceOptions
from tests.plan.conftest import cpu_problem, gh200_problem


def _space(prob, **kw):
    kw.setdefault("runtime_only", False)  # the enumeration itself, pp/cp/ep included
    return search_space(prob, SpaceOptions(**kw))


def test_structure_counts():
    assert len(_space(gh200_problem(k=2), max_staleness=2).structures()) == 3 * 4  # k x fusion
    ppo = gh200_problem(algo="ppo", k=1)
    assert len(_space(ppo, max_staleness=1).structures()) == 2 * 2 * 4  # k x share x fusion
    noref = gh200_problem(k=0, use_reference=False)
    # without a reference there is a single forward pass: no "forward" fusion
    fusions = {st.fusion for st, _ in _space(noref).structures()}
    assert fusions == {"none", "rollout"}


def test_splits_fall_on_node_boundaries():
    assert _space(gh200_problem(gpus=16)).splits() == [4, 8, 12]
    assert _space(cpu_problem()).splits() == [1]  # one node: split its two devices


def test_gen_layout_enumeration_counts_and_reasons():
    s = _space(gh200_problem(gpus=8), tp=(1, 2, 4, 8), gen_pp=(1, 2))
    lays = s.layouts("gen", 8)
    # tp 8 would cross a 4-GPU node: rejected for "devices"; everything else divides 8 devices
    assert {(x.tp, x.pp) for x in lays} == {(t, p) for t in (1, 2, 4) for p in (1, 2)}
    assert s.counts.infeasible["devices"] == 2


def test_train_layout_divisibility():
    s = _space(
        gh200_problem(gpus=12),
        tp=(1, 2, 4),
        pp=(1, 2, 4, 8),
        cp=(1,),
        micro_batch_sizes=(1,),
        recompute=(True,),
        engines=("auto",),
    )
    lays = s.layouts("train", 12)
    for x in lays:
        assert 12 % (x.tp * x.pp) == 0
    # tp*pp in {8 (1x8, 2x4, 4x2), 16 (2x8, 4x4), 32 (4x8)} does not divide 12 devices
    assert s.counts.infeasible["divisibility"] == 6
    assert len(lays) == 12 - 6


def test_none_class_has_one_layout_and_space_size_is_the_product():
    prob = cpu_problem(k=0)
    s = _space(
        prob,
        tp=(1,),
        pp=(1,),
        cp=(1,),
        micro_batch_sizes=(1,),
        recompute=(True,),
        engines=("auto",),
        gen_pp=(1,),
        fusions=("none",),
        offload=(False,),
        streaming=(False,),
    )
    assert s.layouts("none", 2) == [Layout()]
    ev = Evaluator(prob, s)
    # 1 structure x (1 colocated + 1 split) placements x one layout per unit
    assert space_size(s, ev) == 2
