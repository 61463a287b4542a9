"""The plan's ``reshard_after_forward`` reaches the compiled step resolved to a bool.

``auto`` follows the performance model's rule (rpeg.perf.units.keeps_gathered): keep an FSDP
training unit's parameters gathered from forward to backward when the extra memory -- the
rank's unsharded parameters less its own shard -- fits 10% of a device.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rpeg.compile import check_step, compile_plan
from rpeg.config import RunConfig
from rpeg.errors import ConfigError

SHARDED = Path(__file__).resolve().parents[3] / "configs" / "sharded-cpu.yaml"
KEY = "plan.units.train_actor.reshard_after_forward"


def _group(config: RunConfig):
    (g,) = compile_plan(None, config).actor_groups
    return g


def test_auto_keeps_the_tiny_models_parameters_gathered():
    # rpeg-tiny: 4.2e6 params * 4 B (fp32) / 2 = 8.4 MB beyond the shard, against 0.8 GB
    g = _group(RunConfig.from_yaml(SHARDED))
    assert (g.fsdp, g.dp, g.reshard_after_forward) == (True, 2, False)


def test_an_explicit_setting_is_kept():
    g = _group(RunConfig.from_yaml(SHARDED).with_overrides({KEY: True}))
    assert g.reshard_after_forward is True


def test_auto_reshards_when_the_gathered_model_would_not_fit():
    # qwen2.5-7b: 7.6e9 params * 4 B / 2 = 15 GB beyond the shard, against 10% of 8 GB
    config = RunConfig.from_yaml(SHARDED).with_overrides({"model.name": "qwen2.5-7b-instruct"})
    assert _group(config).reshard_after_forward is True
    # ... unless the plan asks for it
    assert _group(config.with_overrides({KEY: False})).reshard_after_forward is False


def test_a_group_without_fsdp_reshards():
    config = RunConfig.from_yaml(SHARDED).with_overrides(
        {"plan.units.train_actor.engine": "auto", KEY: False}
    )
    g = _group(config)
    assert (g.fsdp, g.reshard_after_forward) == (False, True)


def test_a_bad_setting_names_the_field_and_the_choices():
    config = RunConfig.from_yaml(SHARDED).with_overrides({KEY: "sometimes"})
    with pytest.raises(ConfigError) as e:
        compile_plan(None, config)
    assert (
        "units.train_actor.reshard_after_forward: got 'sometimes'; allowed: true, false, auto"
        in str(e.value)
    )


def test_a_compiled_step_holds_a_bool():
    step = compile_plan(None, RunConfig.from_yaml(SHARDED))
    g = dataclasses.replace(step.actor_groups[0], reshard_after_forward="auto")
    bad = dataclasses.replace(step, actor_groups=[g])
    with pytest.raises(ConfigError, match="reshard_after_forward"):
        check_step(bad)
