"""A misspelled field is refused with the closest field and the section's fields; a verl or
TRL key is refused naming the run-config field that holds the same setting."""

import typing

import pytest
import yaml

from rpeg.config import RunConfig
from rpeg.config.foreign_keys import TRL_KEYS, VERL_KEYS, foreign_hint
from rpeg.errors import ConfigError


def _problems(fn) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        fn()
    return {p.where: p.what for p in info.value.problems}


def _field_exists(dotted: str) -> bool:
    """Whether the run config's classes have the dotted field (sections left None by
    default, such as model.lora, included)."""
    cls: object = RunConfig
    for part in dotted.split("."):
        fields = getattr(cls, "model_fields", None)
        if fields is None or part not in fields:
            return False
        ann = fields[part].annotation
        cls = next(
            (
                a
                for a in (ann, *typing.get_args(ann))
                if isinstance(a, type) and hasattr(a, "model_fields")
            ),
            None,
        )
    return True


def test_a_misspelled_field_names_the_closest_and_the_sections_fields():
    got = _problems(lambda: RunConfig().with_overrides({"runtime.stepz": 3}))
    msg = got["runtime.stepz"]
    assert "did you mean 'steps'?" in msg
    assert "checkpoint_every" in msg and "max_staleness" in msg  # the section's fields
    got = _problems(lambda: RunConfig().with_overrides({"model.lora.rnak": 4}))
    assert "did you mean 'rank'?" in got["model.lora.rnak"]
    assert "target_modules" in got["model.lora.rnak"]
    # nothing close: the fields, no guess
    got = _problems(lambda: RunConfig.from_dict({"workload": {"zzz": 1}}))
    assert "did you mean" not in got["workload.zzz"]
    assert "samples_per_prompt" in got["workload.zzz"]


def test_an_unknown_section_lists_the_sections():
    got = _problems(lambda: RunConfig().with_overrides({"rollout.max_new_tokens": 8}))
    msg = got["rollout.max_new_tokens"]
    assert "unknown section 'rollout'" in msg
    for section in ("algorithm", "cluster", "model", "runtime", "task", "workload"):
        assert section in msg


def test_verl_keys_in_a_yaml_name_their_rpeg_fields(tmp_path):
    cfg = {
        "data": {"train_files": "train.parquet", "max_response_length": 1024, "seed": 3},
        "actor_rollout_ref": {"rollout": {"n": 5}, "actor": {"kl_loss_type": "low_var_kl"}},
        "algorithm": {"adv_estimator": "grpo", "kl_coef": 0.0},
        "trainer": {"total_training_steps": 10},
    }
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    got = _problems(lambda: RunConfig.from_yaml(path))
    assert "task.url" in got["data.train_files"]
    assert "workload.max_response_tokens" in got["data.max_response_length"]
    assert "workload.samples_per_prompt" in got["actor_rollout_ref.rollout.n"]
    assert "low_var_kl = k3" in got["actor_rollout_ref.actor.kl_loss_type"]
    assert "algorithm.name" in got["algorithm.adv_estimator"]
    assert "runtime.steps" in got["trainer.total_training_steps"]
    # the section itself is refused too (a key verl has that no field here holds: data.seed)
    assert "data" in got and "workload" in got["data"]
    assert "data.seed" not in got
    assert "algorithm.kl_coef" not in got  # a field both share is read


def test_trl_and_verl_overrides_name_their_rpeg_fields():
    got = _problems(
        lambda: RunConfig().with_overrides(
            {"num_generations": 4, "data.train_batch_size": 64, "learning_rate": 1e-6}
        )
    )
    assert (
        "TRL" in got["num_generations"] and "workload.samples_per_prompt" in got["num_generations"]
    )
    assert "verl" in got["data.train_batch_size"]
    assert "workload.num_prompts" in got["data.train_batch_size"]
    assert "optim.lr" in got["learning_rate"]


@pytest.mark.parametrize("key", sorted(VERL_KEYS) + sorted(TRL_KEYS))
def test_every_translation_names_a_field_that_exists(key):
    field = (VERL_KEYS.get(key) or TRL_KEYS[key])[0]
    assert _field_exists(field), f"{key} -> {field}: no such run-config field"
    assert not _field_exists(key), f"{key} is a run-config field: no translation needed"
    assert field in (foreign_hint(key) or "")


def test_a_misspelled_plan_field_inside_a_unit_names_the_units_fields():
    from rpeg.plan import Plan

    data = {
        "cluster": "local-cpu",
        "model": "rpeg-tiny",
        "graph": {"builder": "grpo"},
        "units": {"train_actor": {"devices": "0-1", "tpp": 2}},
    }
    got = _problems(lambda: Plan.from_dict(data))
    msg = got["units.train_actor.tpp"]
    assert "did you mean 'tp'?" in msg and "micro_batch_size" in msg
