"""Reading a run config's text: a local path, an fsspec URL or literal YAML, parsed safely
(size, alias and expanded-size limits before anything is expanded)."""

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
#: the YAML's size once every alias is expanded, counted on the composed node graph (each
#: anchor's size counted once, then multiplied by its uses) before anything is constructed:
#: at most this many nodes and this many characters of scalars. Under the alias limit, nine
#: levels of ten aliases are still 10**9 nodes (issue 44); a hand-written config has hundreds
MAX_YAML_NODES = 200_000
MAX_YAML_EXPANDED_CHARS = 4 * MAX_YAML_BYTES


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
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise ConfigError([Problem(where, "YAML nested too deeply")]) from None
    try:
        nodes, chars = expanded_size(root)
    except ValueError as exc:
        raise ConfigError([Problem(where, str(exc))]) from None
    if nodes > MAX_YAML_NODES or chars > MAX_YAML_EXPANDED_CHARS:
        raise ConfigError(
            [
                Problem(
                    where,
                    f"the YAML expands to {nodes} nodes and {chars} characters (aliases "
                    f"expanded); a config holds at most {MAX_YAML_NODES} nodes and "
                    f"{MAX_YAML_EXPANDED_CHARS} characters: write the values out",
                )
            ]
        )
    return yaml.safe_load(text)


def expanded_size(root: yaml.Node | None) -> tuple[int, int]:
    """(nodes, scalar characters) of ``root`` with every alias expanded, without expanding
    it: a node reached through several aliases is the same object in the composed graph, so
    its size is computed once (iteratively, post-order) and added at each use. A recursive
    alias is a ``ValueError``."""
    if root is None:
        return 0, 0
    sizes: dict[int, tuple[int, int]] = {}
    opened: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes or (not children_done and id(node) in opened):
            continue
        kids = _children(node)
        if not children_done and kids:
            opened.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in sizes)
            continue
        n, c = 1, len(node.value) if isinstance(node, yaml.ScalarNode) else 0
        for k in kids:
            if id(k) not in sizes:
                raise ValueError("a recursive alias (an anchor used inside its own value)")
            kn, kc = sizes[id(k)]
            n, c = n + kn, c + kc
        sizes[id(node)] = (n, c)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [x for kv in node.value for x in kv]
    return []


def read_text_or_path(text_or_path: str | Path) -> tuple[str, str]:
    """Return (text, source). Accepts a local path, an fsspec URL, or literal YAML text."""
    s = str(text_or_path)
    if "\n" in s or (
        not isinstance(text_or_path, Path) and ":" in s and "://" not in s and not _exists(Path(s))
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
    if not _exists(p):
        raise ConfigError([Problem(s, "file not found")])
    if p.is_dir():
        raise ConfigError([Problem(s, "is a folder; expected a YAML file")])
    return p.read_text(), s


def _exists(p: Path) -> bool:
    """``p.exists()``, False for a name the OS cannot hold (a component over 255 bytes)."""
    try:
        return p.exists()
    except (OSError, ValueError):
        return False
