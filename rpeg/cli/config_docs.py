"""docs/config.md, generated from the schema (:class:`rpeg.config.RunConfig`): every section,
every field with its type, default and description. ``rpeg config docs`` (or
``python -m rpeg.cli.config_docs``) rewrites it; tests/firstday/test_config_surface.py fails
when the file is stale."""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import BaseModel

HEADER = """# Run configuration reference

<!-- generated from rpeg/config/ by `rpeg config docs`; do not edit by hand -->

A run config is YAML with the sections below; every field is optional (the default is
shown). Unknown fields and wrong types are refused before anything starts, naming the dotted
field. Any field can be overridden on the command line after the config file, as
`section.field=value` (the value is read as YAML):

```bash
rpeg train my.yaml algorithm.kl_coef=0.01 runtime.steps=2
rpeg config show my.yaml workload.num_prompts=8      # the merged config, every default shown
```

From Python: `RunConfig.from_yaml("my.yaml").with_overrides({"runtime.steps": 2})`.
"""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(tp))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _subsection(tp: Any) -> type[BaseModel] | None:
    """The section class of a field typed ``Section`` or ``Section | None``, else None."""
    for a in (tp, *typing.get_args(tp)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _section(out: list[str], level: str, name: str, cls: type[BaseModel]) -> None:
    """One section's table, then a table for each of its nested sections (e.g. model.lora)."""
    doc = _cell(cls.__doc__ or "") if cls.__doc__ and "Base of every" not in cls.__doc__ else ""
    out.append(f"\n{level} `{name}`\n")
    if doc:
        out.append(f"{doc}\n")
    out.append("| field | type | default | description |\n| --- | --- | --- | --- |")
    nested = []
    for fname, f in cls.model_fields.items():
        out.append(
            f"| `{name}.{fname}` | {_cell(_type_name(f.annotation))} | {_cell(_default(f))} "
            f"| {_cell(f.description or '')} |"
        )
        sub = _subsection(f.annotation)
        if sub is not None:
            nested.append((f"{name}.{fname}", sub))
    for sub_name, sub in nested:
        _section(out, level + "#", sub_name, sub)


def render_config_docs() -> str:
    from rpeg.config import RunConfig

    out = [HEADER]
    sections, top = [], []
    for name, f in RunConfig.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            sections.append((name, ann))
        else:
            top.append((name, f))
    for name, cls in sections:
        _section(out, "##", name, cls)
    if top:
        out.append("\n## top level\n")
        out.append("| field | type | default | description |\n| --- | --- | --- | --- |")
        for fname, f in top:
            out.append(
                f"| `{fname}` | {_cell(_type_name(f.annotation))} | {_cell(_default(f))} "
                f"| {_cell(f.description or '')} |"
            )
    _foreign(out)
    return "\n".join(out) + "\n"


def _foreign(out: list[str]) -> None:
    """The verl and TRL keys the refusals translate (rpeg.config.foreign_keys)."""
    from rpeg.config.foreign_keys import TRL_KEYS, VERL_KEYS

    out.append("\n## Coming from verl or TRL\n")
    out.append(
        "A verl or TRL key in a config or an override is refused like any unknown field, "
        "and the refusal names the field below that holds the same setting "
        "(`rpeg/config/foreign_keys.py`).\n"
    )
    for who, table in (("verl", VERL_KEYS), ("TRL `GRPOConfig`", TRL_KEYS)):
        out.append(f"| {who} | RPEG | how the value carries over |\n| --- | --- | --- |")
        for key, (field, how) in table.items():
            out.append(f"| `{key}` | `{field}` | {_cell(how) or 'as written'} |")
        out.append("")


if __name__ == "__main__":  # pragma: no cover
    from pathlib import Path

    Path("docs/config.md").write_text(render_config_docs())
