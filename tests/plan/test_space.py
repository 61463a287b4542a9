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
    # of the 6 left, sharded ranks with dp not dividing the 64 prompts are refused by the
    # runtime (they need equal batches): tp > 1 (tp 2, dp 6), (tp 2 pp 2, dp 3), (tp 4, dp 3),
    # and (tp 1, dp 12), which engine auto runs as FSDP on GPUs (rpeg.plan.schema.trains_fsdp);
    # pp > 1 keeps dp replicas, which take unequal shards
    assert s.counts.infeasible["runtime: dp does not divide the prompts"] == 4
    assert sorted((x.tp, x.pp) for x in lays) == [(1, 2), (1, 4)]


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


def test_space_size_counts_what_the_cells_offer():
    # counted without building cells; must equal the product of each cell's candidates
    prob = gh200_problem(gpus=16, k=1)
    s = _space(prob, max_staleness=1)
    ev = Evaluator(prob, s)
    by_cells = 0
    for st, g in s.structures():
        for pl in s.placements(st):
            c = ev.cell(st, g, pl)
            prod = 1
            for name, _, _ in c.units:
                prod *= max(1, len(ev.candidates(c, name)))
            by_cells += prod
    assert by_cells > 100  # a real space: several splits, structures and layouts
    assert space_size(s, ev) == by_cells


def test_a_device_count_past_the_limit_is_refused_with_the_limit():
    import pytest

    from rpeg.config import MAX_DEVICES, RunConfig
    from rpeg.errors import ConfigError

    with pytest.raises(ConfigError, match=f"cluster.num_devices.*{MAX_DEVICES}"):
        RunConfig.from_dict({"cluster": {"num_devices": 10**9}})
