"""One default per knob, in one place: a run's main knobs have their default written only in
the config schema (rpeg/config/), and every other layer reads it from :class:`RunConfig`
(or takes the value as a required argument).

A *default* here is a number literal given to a knob's name where the code would fall back
to it: a parameter default (``def f(micro_batch_size=64)``), a dataclass / pydantic field
(``micro_batch_size: int = 1``, ``Field(1, ...)``), a ``.get("max_staleness", 0)`` /
``getattr(x, "kl_coef", 0.0)`` fallback, a keyword argument (``UnitPlan(micro_batch_size=1)``)
or a dict entry (``{"staleness": 0}``). The knobs are matched by every name they go by
(``staleness`` is ``max_staleness``'s; ``group_size`` is ``samples_per_prompt``'s).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("rpeg", "flows", "tasks", "infra")
SCHEMA = "rpeg/config"  # the package (or module) holding RunConfig's sections

#: config field -> the names it goes by in the code
KNOBS = {
    "micro_batch_size": ("micro_batch_size",),
    "max_staleness": ("max_staleness", "staleness"),
    "kl_coef": ("kl_coef",),
    "samples_per_prompt": ("samples_per_prompt", "group_size"),
    "lr": ("lr", "learning_rate"),
    "max_prompt_tokens": ("max_prompt_tokens",),
    "num_prompts": ("num_prompts",),
    "max_response_tokens": ("max_response_tokens",),
    "train_minibatches": ("train_minibatches",),
    "checkpoint_every": ("checkpoint_every",),
}

#: knobs whose default is written only in the schema today (asserted below)
CHECKED = ("num_prompts", "max_response_tokens", "lr", "checkpoint_every")

#: knobs still written elsewhere too (issue 27: compile/runtime/ir/plan/search are being
#: moved onto RunConfig's values); once one is clean, move it to CHECKED
NOT_YET = (
    "micro_batch_size",
    "max_staleness",
    "kl_coef",
    "samples_per_prompt",
    "max_prompt_tokens",
    "train_minibatches",
)


def _is_number(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Field" and node.args:
        return _is_number(node.args[0])  # pydantic Field(default, ...)
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    )


def _named_values(node: ast.AST) -> list[tuple[str, ast.AST]]:
    """(name, value) pairs where ``node`` gives a value to a name it may fall back to."""
    out: list[tuple[str, ast.AST]] = []
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        a = node.args
        pos = a.posonlyargs + a.args
        out += [
            (p.arg, d) for p, d in zip(pos[len(pos) - len(a.defaults) :], a.defaults, strict=True)
        ]
        out += [
            (p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None
        ]
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
        out.append((node.target.id, node.value))
    elif isinstance(node, ast.Call):
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        if name in ("get", "getattr", "setdefault", "pop") and len(node.args) >= 2:
            key = node.args[-2]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                out.append((key.value, node.args[-1]))
        out += [(k.arg, k.value) for k in node.keywords if k.arg]
    elif isinstance(node, ast.Dict):
        for k, v in zip(node.keys, node.values, strict=True):
            if isinstance(k, ast.Constant) and isinstance(k.value, str):
                out.append((k.value, v))
    return out


def default_sites(files: list[Path], root: Path) -> dict[str, list[str]]:
    """Knob -> ``path:line (name=value)`` of every number literal given to one of its names."""
    by_name = {n: knob for knob, names in KNOBS.items() for n in names}
    sites: dict[str, list[str]] = {k: [] for k in KNOBS}
    for f in files:
        rel = f.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(f.read_text(), rel)):
            for name, value in _named_values(node):
                if name in by_name and _is_number(value):
                    sites[by_name[name]].append(
                        f"{rel}:{node.lineno} ({name}={ast.unparse(value)})"
                    )
    return sites


def _product_files() -> list[Path]:
    return sorted(f for top in PRODUCT for f in (ROOT / top).rglob("*.py"))


def _outside_schema(sites: list[str]) -> list[str]:
    return [s for s in sites if not s.startswith(SCHEMA)]


def test_each_checked_knob_has_its_default_only_in_the_schema():
    sites = default_sites(_product_files(), ROOT)
    for knob in CHECKED:
        in_schema = [s for s in sites[knob] if s.startswith(SCHEMA)]
        assert len(in_schema) == 1, (knob, in_schema)  # the schema's own field, once
        assert _outside_schema(sites[knob]) == [], knob


def test_a_knob_cleaned_up_moves_to_checked():
    """The knobs not yet checked still have a default elsewhere; when one no longer has,
    this fails so that it joins CHECKED (and stays clean)."""
    sites = default_sites(_product_files(), ROOT)
    clean = [k for k in NOT_YET if not _outside_schema(sites[k])]
    assert clean == [], f"clean now, move to CHECKED: {clean}"


def test_every_knob_is_listed_once():
    assert sorted(CHECKED + NOT_YET) == sorted(KNOBS)


def test_the_scan_finds_each_kind_of_default(tmp_path):
    """A hand-written module with one default of each kind; the schema file is exempt."""
    (tmp_path / "rpeg" / "config").mkdir(parents=True)
    (tmp_path / "rpeg" / "config" / "workload.py").write_text(
        "class W:\n    micro_batch_size: int = Field(64, ge=1)\n"
    )
    (tmp_path / "rpeg" / "plan.py").write_text(
        "def f(micro_batch_size=1, *, lr=-1e-4):\n"
        "    return g.get('staleness', 0), getattr(c, 'kl_coef', 0.0)\n"
        "x: int = 0\n"
        "class U:\n    group_size: int = 16\n"
        "u = U(max_prompt_tokens=32)\n"
        "d = {'train_minibatches': 1, 'other': 2}\n"
        "ok = h(micro_batch_size=cfg.micro_batch_size, lr=None, flag=True)\n"
    )
    files = sorted((tmp_path / "rpeg").rglob("*.py"))
    sites = default_sites(files, tmp_path)
    assert sites["micro_batch_size"] == [
        "rpeg/config/workload.py:2 (micro_batch_size=Field(64, ge=1))",
        "rpeg/plan.py:1 (micro_batch_size=1)",
    ]
    assert sites["lr"] == ["rpeg/plan.py:1 (lr=-0.0001)"]
    assert sites["max_staleness"] == ["rpeg/plan.py:2 (staleness=0)"]
    assert sites["kl_coef"] == ["rpeg/plan.py:2 (kl_coef=0.0)"]
    assert sites["samples_per_prompt"] == ["rpeg/plan.py:5 (group_size=16)"]
    assert sites["max_prompt_tokens"] == ["rpeg/plan.py:6 (max_prompt_tokens=32)"]
    assert sites["train_minibatches"] == ["rpeg/plan.py:7 (train_minibatches=1)"]
    assert _outside_schema(sites["micro_batch_size"]) == ["rpeg/plan.py:1 (micro_batch_size=1)"]
