"""Reading a run config's text: a local path, an fsspec URL or literal YAML, parsed safely
(size and alias limits before anything is expanded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rpeg.errors import ConfigError, Problem

#: a run config's YAML: at most this many bytes and alias references (``*name``): an alias
#: expands to its anchor's whole value, so nine levels of ten aliases each are a billion
#: nodes ("billion laughs") that exhaust memory when anything walks them (issue 28:
#: ``with_overrides`` -> ``model_dump`` did); a hand-written config uses a handful
MAX_YAML_BYTES = 16 * 2**20
MAX_YAML_ALIASES = 100


def safe_yaml(text: str, source: str = "") -> Any:
    """``yaml.safe_load`` of a config with the size and alias limits above (a
    :class:`ConfigError` naming the limit, before anything is expanded)."""
    where = source or "yaml"
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(
            [Problem(where, f"{len(text)} bytes of YAML; a config holds at most {MAX_YAML_BYTES}")]
        )
    aliases = sum(
        isinstance(ev, yaml.AliasEvent) for ev in yaml.parse(text, Loader=yaml.SafeLoader)
    )
    if aliases > MAX_YAML_ALIASES:
        raise ConfigError(
            [
                Problem(
                    where,
                    f"{aliases} YAML aliases (*name); at most {MAX_YAML_ALIASES} (each expands "
                    "to its anchor's whole value: write the values out)",
                )
            ]
        )
    return yaml.safe_load(text)


def read_text_or_path(text_or_path: str | Path) -> tuple[str, str]:
    """Return (text, source). Accepts a local path, an fsspec URL, or literal YAML text."""
    s = str(text_or_path)
    if "\n" in s or (
        not isinstance(text_or_path, Path) and ":" in s and "://" not in s and not Path(s).exists()
    ):
        return s, ""
    if "://" in s:
        import fsspec  # fsspec is pure Python and allowed in pure layers

        try:
            with fsspec.open(s, "r") as fh:
                return fh.read(), s
        except FileNotFoundError:
            raise ConfigError([Problem(s, "file not found")]) from None
    p = Path(s)
    if not p.exists():
        raise ConfigError([Problem(s, "file not found")])
    if p.is_dir():
        raise ConfigError([Problem(s, "is a folder; expected a YAML file")])
    return p.read_text(), s
