"""Dotted overrides after the config on the command line, as Hydra and NeMo-RL users type
them: ``rpeg train my.yaml algorithm.kl_coef=0.01 runtime.steps=2``.

Each value is read as YAML (``2`` an int, ``0.01`` a float, ``true`` a bool, ``null`` None,
``[a, b]`` a list, anything else text) and the result is validated like the file
(:meth:`rpeg.config.RunConfig.with_overrides`): an unknown field or a wrong type is a
:class:`rpeg.errors.ConfigError` naming the dotted field, before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rpeg.config.yaml_io import safe_yaml
from rpeg.errors import ConfigError, Problem


def looks_like_override(arg: str | None) -> bool:
    """``FIELD=VALUE`` whose left side is a dotted name and that is not an existing file."""
    if not arg or "=" not in arg or "\n" in arg or "://" in arg.split("=", 1)[0]:
        return False
    key = arg.split("=", 1)[0]
    return bool(key) and all(p.isidentifier() for p in key.split(".")) and not _is_file(arg)


def _is_file(arg: str) -> bool:
    """Whether ``arg`` names an existing path; a name the OS cannot hold (longer than 255
    bytes per component: a long ``task.system_prompt=...``) is no file (issue 44)."""
    try:
        return Path(arg).exists()
    except (OSError, ValueError):
        return False


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c.d=x"]`` -> ``{"a.b": 1, "c.d": "x"}``; every malformed item at once."""
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    for item in items:
        if not looks_like_override(item):
            problems.append(
                Problem(item, "expected FIELD=VALUE with a dotted field, e.g. runtime.steps=2")
            )
            continue
        key, text = item.split("=", 1)
        try:
            out[key] = safe_yaml(text, key) if text.strip() else ""
        except yaml.YAMLError as exc:
            problems.append(Problem(key, f"value {text!r} is not valid YAML: {exc}"))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems, title="invalid overrides")
    return out


def split_config_and_overrides(
    config: str | None, rest: list[str] | None
) -> tuple[str | None, dict[str, Any]]:
    """The CLI's optional config argument and the overrides after it: a first argument that
    is an override (no config given) moves to the overrides."""
    items = list(rest or [])
    if looks_like_override(config):
        items.insert(0, config)
        config = None
    return config, parse_overrides(items)


def load_with_overrides(config: str | None, rest: list[str] | None):
    """The run config at ``config`` (None: the defaults) with the overrides ``rest`` applied."""
    from rpeg.preflight import load_config

    source, overrides = split_config_and_overrides(config, rest)
    cfg = load_config(source)
    return cfg.with_overrides(overrides) if overrides else cfg
