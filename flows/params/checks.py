"""Checking the flows' parameters: one human line per bad field (:func:`validate_params`,
:func:`one_line`), a deployment's form defaults from a config (:func:`form_defaults`) and the
CLI's ``--param NAME=VALUE`` (:func:`parse_param_assignments`)."""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import BaseModel, ValidationError
from rpeg.flows.params.models import BaseParams, RetrainParams, load_config

from rpeg.errors import ConfigError, Problem


def _explain(err: dict[str, Any], model: type[BaseModel]) -> Problem:
    """One pydantic error as ``Title (name): what is allowed (got X)``."""
    loc = [str(p) for p in err.get("loc", ())]
    name = loc[0] if loc else ""
    info = model.model_fields.get(name)
    title = (info.title if info is not None else None) or name
    where = f"{title} ({name})" if title != name else name
    got = err.get("input")
    ctx = err.get("ctx") or {}
    t = err["type"]
    bounds = {
        "greater_than_equal": "at least {ge}",
        "greater_than": "more than {gt}",
        "less_than_equal": "at most {le}",
        "less_than": "less than {lt}",
    }
    if t in bounds:
        what = "must be " + bounds[t].format(**ctx)
    elif t in ("int_type", "int_parsing", "int_from_float"):
        what = "must be a whole number"
    elif t in ("float_type", "float_parsing", "finite_number"):
        what = "must be a finite number"
    elif t in ("bool_type", "bool_parsing"):
        what = "must be true or false"
    elif t == "string_pattern_mismatch" and name == "cluster_address":
        what = "must look like tcp://host:port (or tls://, ucx://), or be empty"
    elif t == "literal_error":
        what = f"must be one of {ctx.get('expected')}"
    elif t == "extra_forbidden":
        allowed = ", ".join(model.model_fields)
        return Problem(name, f"unknown parameter; the parameters are: {allowed}")
    elif t == "missing":
        return Problem(where, "is required")
    else:
        what = err.get("msg", t)
        if what.startswith("Value error, "):
            return Problem(where, what[len("Value error, ") :])
    if len(loc) > 1:
        where += " " + ".".join(loc[1:])
    return Problem(where, f"{what} (got {got!r})")


def validate_params(model: type[BaseParams], values: dict[str, Any]) -> Any:
    """``model`` from ``values``; ConfigError with one human line per bad field."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(
            [_explain(e, model) for e in exc.errors()], title="parameters refused"
        ) from None


def one_line(exc: BaseException) -> str:
    """An error as one line (``title: problem; problem``) for a log line or a state message."""
    problems = getattr(exc, "problems", None)
    if problems:
        title = getattr(exc, "title", "refused")
        return f"{title}: " + "; ".join(str(p) for p in problems)
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")


def form_defaults(model: type[BaseParams], config: str, **given: Any) -> dict[str, Any]:
    """Deployment defaults for ``model``'s form: the config's own values for the numeric
    fields (so the form shows what the config runs), then ``given``; validated."""
    cfg = load_config(config)
    from_cfg = {
        "lr": cfg.optim.lr,
        "max_staleness": cfg.runtime.max_staleness,
        "steps": cfg.runtime.steps,
        "num_prompts": cfg.workload.num_prompts,
        "samples_per_prompt": cfg.workload.samples_per_prompt,
    }
    values = {k: v for k, v in from_cfg.items() if k in model.model_fields}
    if model is RetrainParams:
        values.pop("steps")
    values.update({"config": config, **given})
    p = validate_params(model, values)
    return p.model_dump(mode="json")


def parse_param_assignments(items: list[str] | None) -> dict[str, Any]:
    """CLI helper: ``["steps=5", "lr=1e-5", "overrides={\\"a.b\\": 1}"]`` -> dict (values as YAML)."""
    import yaml

    out: dict[str, Any] = {}
    problems = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            problems.append(Problem(item, "expected NAME=VALUE"))
            continue
        v = yaml.safe_load(value) if value.strip() else ""
        if isinstance(v, str):  # YAML 1.1 reads 1e-5 as a string
            with contextlib.suppress(ValueError):
                v = float(v)
        out[key.strip()] = v
    if problems:
        raise ConfigError(problems, title="invalid --param")
    return out
