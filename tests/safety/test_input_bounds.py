"""Issue 44, items 3 and 13: a config's YAML is bounded by its expanded size (not only its
alias count), and a long CLI override is a value, not a file name."""

from __future__ import annotations

import time

import pytest

from rpeg.cli.overrides import looks_like_override, parse_overrides
from rpeg.config import MAX_YAML_ALIASES, RunConfig
from rpeg.config.yaml_io import MAX_YAML_NODES, expanded_size, safe_yaml
from rpeg.errors import ConfigError


def _laughs(levels: int, width: int) -> str:
    lines = ["plan:", '  a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_laughs_under_the_alias_limit_are_refused_by_their_expanded_size():
    text = _laughs(9, 10)  # 90 aliases: under the alias limit, 10**9 leaves expanded
    assert text.count("*") < MAX_YAML_ALIASES
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="expands to") as got:
        RunConfig.from_yaml(text)
    assert time.monotonic() - t0 < 2
    assert str(MAX_YAML_NODES) in str(got.value)


def test_laughs_in_a_cli_override_value_are_refused_naming_the_field():
    parts = ["a: &b0 [x, x, x, x, x, x, x, x, x, x]"]
    parts += [f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 10)}]" for i in range(1, 9)]
    value = "{" + ", ".join(parts) + "}"
    with pytest.raises(ConfigError, match="task.system_prompt.*expands to"):
        parse_overrides([f"task.system_prompt={value}"])


def test_expanded_size_counts_each_use_of_an_anchor():
    import yaml

    # [x, y] used three times: the root list + 3 copies of (list + 2 scalars) = 10 nodes
    root = yaml.compose("- &p [x, y]\n- *p\n- *p\n", Loader=yaml.SafeLoader)
    assert expanded_size(root) == (10, 6)


def test_a_recursive_alias_is_refused():
    with pytest.raises(ConfigError, match="recursive alias"):
        safe_yaml("a: &x [1, *x]\n")


def test_an_ordinary_config_with_aliases_still_loads():
    cfg = RunConfig.from_yaml("runtime: &rt\n  steps: 3\n")
    assert cfg.runtime.steps == 3


def test_an_override_longer_than_a_file_name_is_a_value():
    prompt = "You are careful. " * 40  # ~680 bytes: over the OS's 255-byte name limit
    item = f"task.system_prompt={prompt}"
    assert looks_like_override(item)
    assert parse_overrides([item]) == {"task.system_prompt": prompt.strip()}
    cfg = RunConfig().with_overrides(parse_overrides([item]))
    assert cfg.task.system_prompt == prompt.strip()


def test_a_config_path_longer_than_a_file_name_is_not_found():
    with pytest.raises(ConfigError, match="file not found"):
        RunConfig.from_yaml("c" * 300 + ".yaml")
