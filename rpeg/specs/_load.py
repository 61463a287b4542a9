"""Shared helpers of the catalog loaders: reading shipped/user YAML and checking fields."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rpeg.errors import Problem, ProblemsError


class SpecError(ProblemsError):
    """A catalog entry (GPU, cluster, model) that does not validate, or an unknown name."""

    title = "invalid spec"


def user_specs_dir() -> Path:
    """Where user overrides live: ``$RPEG_SPECS_DIR`` or ``~/.config/rpeg``."""
    env = os.environ.get("RPEG_SPECS_DIR")
    return Path(env) if env else Path.home() / ".config" / "rpeg"


def read_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([Problem(source, f"not valid YAML: {exc}")]) from None
    if not isinstance(data, dict):
        raise SpecError([Problem(source, "top level must be a mapping")])
    return data


def shipped_and_user(filename: str) -> list[tuple[dict[str, Any], str]]:
    """The shipped catalog file, then the user's file of the same name if present."""
    out = []
    text = resources.files("rpeg.specs").joinpath("data", filename).read_text()
    out.append((read_yaml(text, f"rpeg/specs/data/{filename}"), f"rpeg/specs/data/{filename}"))
    user = user_specs_dir() / filename
    if user.is_file():
        out.append((read_yaml(user.read_text(), str(user)), str(user)))
    return out


class Checker:
    """Collects problems while reading one mapping."""

    def __init__(self, where: str, data: Any, problems: list[Problem]):
        self.where = where
        self.problems = problems
        if not isinstance(data, dict):
            problems.append(Problem(where, "must be a mapping"))
            data = {}
        self.data = data
        self.used: set[str] = set()

    def num(
        self,
        key: str,
        *,
        lo: float | None = None,
        hi: float | None = None,
        default: Any = ...,
        integer: bool = False,
        unit: str = "",
    ) -> Any:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if default is ...:
                self.problems.append(Problem(f"{self.where}.{key}", "missing (required)"))
                return lo if lo is not None else 0
            return default
        v = self.data[key]
        u = f" {unit}" if unit else ""
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or (integer and not isinstance(v, int))
        ):
            kind = "an integer" if integer else "a number"
            self.problems.append(Problem(f"{self.where}.{key}", f"must be {kind}{u} (got {v!r})"))
            return lo if lo is not None else 0
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            self.problems.append(
                Problem(f"{self.where}.{key}", f"{v}{u} out of range [{lo}, {hi}]")
            )
        return v

    def text(self, key: str, *, default: Any = ..., choices: tuple[str, ...] | None = None) -> Any:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if default is ...:
                self.problems.append(Problem(f"{self.where}.{key}", "missing (required)"))
                return ""
            return default
        v = self.data[key]
        if not isinstance(v, str):
            self.problems.append(Problem(f"{self.where}.{key}", f"must be a string (got {v!r})"))
            return str(v)
        if choices and v not in choices:
            self.problems.append(
                Problem(f"{self.where}.{key}", f"got {v!r}; allowed: {', '.join(choices)}")
            )
        return v

    def flag(self, key: str, default: bool = False) -> bool:
        self.used.add(key)
        v = self.data.get(key, default)
        if not isinstance(v, bool):
            self.problems.append(Problem(f"{self.where}.{key}", f"must be true/false (got {v!r})"))
            return default
        return v

    def sub(self, key: str, *, required: bool = False) -> Checker | None:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if required:
                self.problems.append(Problem(f"{self.where}.{key}", "missing (required)"))
                return Checker(f"{self.where}.{key}", {}, self.problems)
            return None
        return Checker(f"{self.where}.{key}", self.data[key], self.problems)

    def curve(self, key: str, default: Any = None) -> tuple[tuple[float, float], ...] | None:
        """A piecewise-linear curve: list of [log10_x, fraction] with increasing x, 0<f<=1."""
        self.used.add(key)
        v = self.data.get(key)
        if v is None:
            return default
        where = f"{self.where}.{key}"
        if not isinstance(v, list) or len(v) < 2:
            self.problems.append(Problem(where, "must be a list of >= 2 [log10_x, fraction] pairs"))
            return default
        pts = []
        for i, p in enumerate(v):
            if (
                not isinstance(p, (list, tuple))
                or len(p) != 2
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in p)
            ):
                self.problems.append(
                    Problem(f"{where}[{i}]", f"must be [log10_x, fraction] (got {p!r})")
                )
                return default
            if not 0 < p[1] <= 1:
                self.problems.append(
                    Problem(f"{where}[{i}]", f"fraction {p[1]} out of range (0, 1]")
                )
            pts.append((float(p[0]), float(p[1])))
        if any(b[0] <= a[0] for a, b in zip(pts, pts[1:], strict=False)):
            self.problems.append(Problem(where, "x values must increase"))
        return tuple(pts)

    def done(self) -> None:
        for key in self.data:
            if key not in self.used:
                self.problems.append(Problem(f"{self.where}.{key}", "unknown field"))


def interp_log(curve: tuple[tuple[float, float], ...], x: float) -> float:
    """Evaluate a piecewise-linear curve over log10(x), clamped at both ends."""
    import math

    lx = math.log10(x) if x > 0 else -30.0
    if lx <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if lx <= x1:
            return y0 + (y1 - y0) * (lx - x0) / (x1 - x0)
    return curve[-1][1]
