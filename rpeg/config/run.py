"""One run's configuration (:class:`RunConfig`: every section), its loading from a dict or
YAML, dotted overrides, and pydantic's errors as :class:`Problem` s naming dotted fields."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError

from rpeg.config.algorithm import AlgorithmConfig, OptimConfig
from rpeg.config.execution import ClusterConfig, RuntimeConfig, SearchConfig
from rpeg.config.foreign_keys import foreign_hint, foreign_leaves
from rpeg.config.section import Section
from rpeg.config.workload import ModelConfig, TaskConfig, WorkloadConfig
from rpeg.config.yaml_io import read_text_or_path, safe_yaml
from rpeg.errors import ConfigError, Problem


class RunConfig(Section):
    """One run: model, algorithm, workload, task, optimizer, cluster, plan, runtime."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    plan: str | dict[str, Any] | None = Field(
        None,
        description="an execution plan (path/URL of plan YAML, or inline); None = let the runtime choose",
    )

    @property
    def warmup_sft_steps(self) -> int:
        """Warm-up steps actually run (resolves ``optim.warmup_sft_steps=None``)."""
        if self.optim.warmup_sft_steps is not None:
            return self.optim.warmup_sft_steps
        return 150 if self.model.path is None else 0

    # --- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, *, source: str = "") -> RunConfig:
        """Validate ``data``; raise :class:`ConfigError` listing every problem."""
        try:
            return cls.model_validate(data or {})
        except ValidationError as exc:
            raise ConfigError(problems_from_pydantic(exc, cls), title=_title(source)) from None

    @classmethod
    def from_yaml(cls, text_or_path: str | Path) -> RunConfig:
        """Load from a YAML path, fsspec URL, or a YAML string."""
        text, source = read_text_or_path(text_or_path)
        try:
            data = safe_yaml(text, source)
        except yaml.YAMLError as exc:
            raise ConfigError([Problem(source or "yaml", f"not valid YAML: {exc}")]) from None
        if data is not None and not isinstance(data, dict):
            raise ConfigError(
                [Problem(source or "yaml", "top level must be a mapping of sections")]
            )
        return cls.from_dict(data, source=source)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def with_overrides(self, overrides: dict[str, Any]) -> RunConfig:
        """Apply dotted overrides such as ``{"runtime.steps": 5}``, validating all at once.
        Fields left at their defaults stay unset (``model_fields_set``): a default that
        follows the data (``workload.max_prompt_tokens``) still can."""
        data = self.model_dump(mode="json", exclude_unset=True)
        full = self.model_dump(mode="json")
        problems: list[Problem] = []
        for dotted, value in overrides.items():
            node, known = data, full
            parts = dotted.split(".")
            for part in parts[:-1]:
                if not isinstance(known, dict) or part not in known:
                    hint = foreign_hint(dotted)
                    if hint:
                        problems.append(Problem(dotted, f"unknown field: {hint}"))
                        break
                    where = (
                        [k for k, v in known.items() if isinstance(v, dict)]
                        if isinstance(known, dict)
                        else []
                    )
                    problems.append(
                        Problem(dotted, f"unknown section {part!r}{_choices(part, where)}")
                    )
                    break
                if not isinstance(node.get(part), dict):
                    node[part] = {}  # a section left at its defaults: set only what is named
                node, known = node[part], known[part]
            else:
                node[parts[-1]] = value
        try:
            out = RunConfig.from_dict(data, source="overrides")
        except ConfigError as exc:
            raise ConfigError(problems + list(exc.problems), title="invalid overrides") from None
        if problems:
            raise ConfigError(problems, title="invalid overrides")
        return out


def _title(source: str) -> str:
    return f"invalid configuration {source}".strip()


def _choices(name: str, allowed: list[str]) -> str:
    """`` (did you mean 'x'?; allowed: a, b)`` for a name not among ``allowed``."""
    if not allowed:
        return ""
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f" ({hint}allowed: {', '.join(sorted(allowed))})"


def _model_in(ann: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the pydantic model a field's annotation holds, whether inside a container: a
    ``dict[str, Unit]`` or ``list[Unit]``, whose key or index comes next in a path)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann, False
    origin = get_origin(ann)
    for a in get_args(ann):
        found, inner = _model_in(a)
        if found is not None:
            return found, inner or origin in (dict, list, tuple)
    return None, False


def _fields_at(root: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the section ``loc`` (the path to the unknown key's parent) names
    in ``root`` (through a dict's key or a list's index: ``units.train_actor``); empty where
    the path leaves pydantic models."""
    model: Any = root
    skip = False  # the next part is a container's key or index
    for part in loc:
        if skip:
            skip = False
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
        info = model.model_fields.get(str(part))
        if info is None:
            return []
        model, skip = _model_in(info.annotation)
    if isinstance(model, type) and issubclass(model, BaseModel) and not skip:
        return list(model.model_fields)
    return []


def problems_from_pydantic(
    exc: ValidationError, root: type[BaseModel] | None = None
) -> list[Problem]:
    """Turn pydantic's error list into :class:`Problem` s with dotted paths; an unknown
    field names the section's fields (and the closest one) where ``root``, the validated
    model class, is given."""
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        ctx = err.get("ctx") or {}
        if err["type"] == "literal_error" and "expected" in ctx:
            msg = f"got {err.get('input')!r}; allowed: {ctx['expected']}"
        elif err["type"] == "extra_forbidden":
            key = str(err["loc"][-1]) if err["loc"] else ""
            hint = foreign_hint(loc)
            leaves = [] if hint else foreign_leaves(loc, err.get("input"))
            if hint:
                msg = f"unknown field: {hint}"
            else:
                msg = "unknown field" + _choices(key, _fields_at(root, tuple(err["loc"][:-1])))
            if leaves:  # an unknown section of another framework's keys: each one named
                out.append(Problem(loc, msg))
                out += [Problem(leaf, f"unknown field: {foreign_hint(leaf)}") for leaf in leaves]
                continue
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif err["type"].startswith(("greater", "less")):
            msg = f"{msg} (got {err.get('input')!r})"
        out.append(Problem(loc, msg))
    return out
