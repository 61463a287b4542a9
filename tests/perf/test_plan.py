"""Plan: YAML round trip, device ranges, colocation, validation errors."""

import pytest

from rpeg.errors import ConfigError
from rpeg.ir import builders
from rpeg.plan import Plan, colocated_plan, disaggregated_plan, format_devices, parse_devices


def test_device_ranges():
    assert parse_devices("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_devices((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    with pytest.raises(ValueError):
        parse_devices("3-1")


def test_yaml_round_trip_and_colocation():
    g = builders.build("grpo", use_reference=True, staleness=1)
    plan = disaggregated_plan(
        g, "dgx-h100", num_nodes=2, gen_devices=8, train_devices=8, model="llama3.1-8b"
    )
    text = plan.to_yaml()
    assert "devices: 0-7" in text
    again = Plan.from_yaml(text)
    assert again == plan
    groups = sorted(sorted(x) for x in plan.colocated())
    assert ["generate", "reward"] in groups
    # no partial rollout unless asked: the runtime refuses it (rpeg.compile.checks)
    assert plan.num_devices == 16 and not plan.partial_rollout and plan.staleness == 1
    co = colocated_plan(g, "dgx-h100", num_nodes=1, model="llama3.1-8b")
    assert len(co.colocated()) == 1


def test_plan_errors_list_every_problem():
    bad = {
        "staleness": -1,
        "units": {"generate": {"devices": "0-7", "tp": 3}, "train": {"devices": "0-7", "zz": 1}},
    }
    with pytest.raises(ConfigError) as info:
        Plan.from_dict(bad)
    wheres = " ".join(p.where for p in info.value.problems)
    assert "staleness" in wheres and "units.generate" in wheres and "units.train.zz" in wheres
