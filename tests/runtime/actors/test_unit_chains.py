"""Chains of units issued as one call per rank: which units join (pure rules, hand-worked
rows), the shipped configs' chains, and on a cluster that a chained step computes exactly
what the unit-by-unit step does, in one call per rank, each unit still recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpeg.runtime.actors.unit_chains import ChainUnit, step_chains, unit_chains

ROOT = Path(__file__).resolve().parents[3]
L = (1, 1)


def U(name, waits=(), group="g0", layout=L, reads=(), streaming=False):
    return ChainUnit(name, group, layout, tuple(waits), tuple(reads), streaming)


def test_a_row_of_units_on_one_group_is_one_chain():
    units = [U("gen"), U("rew", ["gen"]), U("ref", ["gen", "rew"]), U("train", ["ref", "rew"])]
    assert unit_chains(units) == [("gen", "rew", "ref", "train")]


def test_another_group_or_layout_starts_a_new_chain():
    units = [U("gen"), U("rew", ["gen"]), U("ref", ["rew"], group="g1"), U("adv", ["ref"])]
    assert unit_chains(units) == [("gen", "rew"), ("ref",), ("adv",)]
    units = [U("gen", layout=(4, 1)), U("train", ["gen"], layout=(2, 2))]  # reshard between
    assert unit_chains(units) == [("gen",), ("train",)]


def test_a_unit_that_does_not_wait_for_the_last_one_stands_alone():
    # "ref" only needs "gen": the scheduler may issue it while "rew" runs (no chain with it)
    units = [U("gen"), U("rew", ["gen"]), U("ref", ["gen"])]
    assert unit_chains(units) == [("gen", "rew"), ("ref",)]


def test_waits_from_outside_the_chain_and_pulls_break_it():
    # "adv" also waits for "x" on another group: not awaited by the chain's head
    units = [U("gen"), U("x", group="g1"), U("rew", ["gen"]), U("adv", ["rew", "x"])]
    assert unit_chains(units) == [("gen",), ("x",), ("rew",), ("adv",)]
    # a head may wait for another group (its rows are pulled before the chain starts) ...
    units = [U("x", group="g1"), U("ref", ["x"], reads=["x"]), U("adv", ["ref", "x"])]
    assert unit_chains(units) == [("x",), ("ref", "adv")]
    # ... a later unit may not read rows from one
    units = [U("x", group="g1"), U("ref", ["x"]), U("adv", ["ref", "x"], reads=["x"])]
    assert unit_chains(units) == [("x",), ("ref",), ("adv",)]


def test_a_unit_another_group_waits_for_ends_its_chain():
    units = [U("gen"), U("rew", ["gen"]), U("ref", ["rew"]), U("critic", ["rew"], group="g1")]
    assert unit_chains(units) == [("gen", "rew"), ("ref",), ("critic",)]


def test_streaming_units_are_never_chained():
    units = [U("gen", streaming=True), U("ref", ["gen"]), U("adv", ["ref"])]
    assert unit_chains(units) == [("gen",), ("ref", "adv")]
    units = [U("gen"), U("ref", ["gen"], streaming=True), U("adv", ["ref"])]
    assert unit_chains(units) == [("gen",), ("ref",), ("adv",)]


def test_every_unit_is_in_exactly_one_chain_in_order():
    import random

    rnd = random.Random(0)
    for _ in range(200):
        units = []
        for i in range(rnd.randint(1, 8)):
            waits = [u.name for u in units if rnd.random() < 0.5]
            units.append(U(f"u{i}", waits, group=rnd.choice(["g0", "g1"])))
        chains = unit_chains(units)
        assert [n for c in chains for n in c] == [u.name for u in units]
        for c in chains:  # each member waits for the one before it, on the head's group
            by = {u.name: u for u in units}
            for a, b in zip(c, c[1:], strict=False):
                assert a in by[b].waits and by[a].group == by[b].group


@pytest.mark.parametrize(
    "config,expect",
    [
        (
            "sharded-cpu.yaml",
            [
                (
                    "generate",
                    "reward",
                    "ref_logprob",
                    "old_logprob",
                    "advantage",
                    "train_actor",
                    "sync_weights",
                )
            ],
        ),
        # async: rollout units run inside rollouts; the trainer's units chain after take
        ("async-cpu.yaml", [("ref_logprob", "old_logprob", "advantage", "train_actor")]),
    ],
)
def test_the_shipped_configs_chains(config, expect):
    from rpeg.compile import compile_plan
    from rpeg.config import RunConfig

    cfg = RunConfig.from_yaml(ROOT / "configs" / config)
    assert step_chains(compile_plan(cfg.plan, cfg)) == expect


# --------------------------------------------------------------------------- on a cluster
@pytest.mark.slow
def test_a_chained_step_equals_the_unit_by_unit_step(tmp_path, dask_cluster):
    """Two steps of the built-in task on one rank, chained and unit by unit (the same seeds):
    bit-identical metrics and weights; chained, one ``run_units`` call per step and no
    ``run_unit`` call, every unit its own timeline record in order."""
    from rpeg.compile import compile_plan
    from rpeg.runtime.actors.driver import DistributedRun
    from tests.runtime.actors.conftest import tiny_config

    cfg = tiny_config(tmp_path, **{"cluster.num_devices": 1, "optim.warmup_sft_steps": 0})
    out = {}
    for chained in (True, False):
        compiled = compile_plan(None, cfg)
        names = [t.name for t in compiled.tasks]
        run = DistributedRun(cfg, compiled, dask_cluster)
        assert list(run.units.chains.values()) == [tuple(names)]
        if not chained:
            run.units.chains = {}
        run.start_actors()
        calls = {"run_unit": 0, "run_units": 0}
        group = run.group(compiled.trainer_group)
        for name in calls:
            real = getattr(type(group), name)

            def counted(self, *a, _real=real, _name=name, _calls=calls, **k):
                _calls[_name] += 1
                return _real(self, *a, **k)

            setattr(group, name, counted.__get__(group))
        try:
            metrics = []
            for step in range(2):
                m = {}
                for n in names:
                    m.update(run.run_unit(step, n))
                run.release(step)
                metrics.append({k: v for k, v in m.items() if not k.endswith("_s")})
            checksum = run.param_checksums()
        finally:
            run.close()
        records = [r for r in run.timeline.records if r.step == 1]
        out[chained] = (metrics, checksum, calls, records)
    (m1, c1, calls1, rec1), (m0, c0, calls0, _) = out[True], out[False]
    assert c1 == c0
    for a, b in zip(m1, m0, strict=True):
        keys = [k for k in a if not k.startswith(("unit_s", "tokens_per_s", "gen_tokens_per"))]
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert calls1 == {"run_unit": 0, "run_units": 2}
    assert calls0 == {"run_unit": 2 * len(names), "run_units": 0}
    assert [r.stage for r in rec1] == names
    for a, b in zip(rec1, rec1[1:], strict=False):
        assert a.start_s <= a.end_s <= b.start_s <= b.end_s
