"""A config's YAML is loaded with an alias and size limit (issue 28: nine levels of ten
aliases under ``plan:`` exhausted memory as soon as a CLI override was given)."""

from __future__ import annotations

import pytest

from rpeg.config import MAX_YAML_ALIASES, RunConfig
from rpeg.errors import ConfigError

LAUGHS = "\n".join(
    ["plan:", '  a0: &a0 ["lol"]']
    + [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
)


def test_billion_laughs_is_refused_before_it_expands():
    # 9 levels x 10 aliases + 11 more: 101, one over the limit
    with pytest.raises(ConfigError, match="101 YAML aliases") as got:
        RunConfig.from_yaml(
            LAUGHS + "\n  a10: [*a9, *a9, *a9, *a9, *a9, *a9, *a9, *a9, *a9, *a9, *a9]\n"
        )
    assert str(MAX_YAML_ALIASES) in str(got.value)


def test_a_config_with_a_few_aliases_still_loads():
    text = "runtime: &rt\n  steps: 3\n"
    assert RunConfig.from_yaml(text).runtime.steps == 3


def test_an_oversized_config_is_refused(monkeypatch):
    monkeypatch.setattr("rpeg.config.yaml_io.MAX_YAML_BYTES", 100)
    with pytest.raises(ConfigError, match="bytes of YAML"):
        RunConfig.from_yaml("runtime:\n  steps: 3\n" + "#" * 200 + "\n")
