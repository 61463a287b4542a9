"""One default per knob, in one place: a run's main knobs have their default written only in
:mod:`rpeg.defaults` (a bottom module importing nothing, so the IR, which may not import the
config, can read it too). The config schema's fields (rpeg/config/) read it, which is where a
user sees the defaults (``rpeg config docs``); every other layer reads it, takes the value from
:class:`RunConfig`, or takes it as a required argument.

A *default* here is a number literal given to a knob's name where the code would fall back
to it: a parameter default (``def f(micro_batch_size=64)``), a dataclass / pydantic field
(``micro_batch_size: int = 1``, ``Field(1, ...)``), a ``.get("max_staleness", 0)`` /
``getattr(x, "kl_coef", 0.0)`` fallback, a keyword argument (``UnitPlan(micro_batch_size=1)``)
or a dict entry (``{"staleness": 0}``). The knobs are matched by every name they go by
(``staleness`` is ``max_staleness``'s; ``group_size`` is ``samples_per_prompt``'s).

Knobs that look alike but are not the same, and how they were told apart:

* A plan unit's ``micro_batch_size`` (``UnitPlan``, the plan builders, the search's
  ``Layout``) is 1 where a plan does not say, not the workload's 64: generation units must run
  at 1 (``check_step`` refuses more) and reward/advantage units make one pass over their rows;
  the default plan passes the workload's value to its forward units. It is its own constant,
  ``rpeg.defaults.UNIT_MICRO_BATCH_SIZE``, beside the workload's, with that reason written there.
* The performance model's ``Workload`` had ``micro_batch_size`` 1 that nothing read (it prices
  each unit's plan value): removed. Its ``train_minibatches`` is now a required argument.
* ``rpeg plan --gpu`` sizes ``max_prompt_tokens`` for a real model (1024, the config's 32 is
  for the tiny CPU model): ``rpeg.defaults.GPU_MAX_PROMPT_TOKENS``, in the same home.
* The search space's ``Structure.staleness`` is one candidate's k (the space ranges over
  ``0..SpaceOptions.max_staleness``): required, no default. ``SpaceOptions.max_staleness`` and
  the plan's and the graph's staleness are the run's bound and read ``MAX_STALENESS``.
* A generate unit's ``gpu_memory_utilization`` (issue 37: 8 sites, 4 values) is 0.8 where a
  plan does not say (``UnitPlan``, the disaggregated builder) and 0.6 in the colocated builder,
  where the trainer's state stays resident beside the engine:
  ``GPU_MEMORY_UTILIZATION`` and ``COLOCATED_GPU_MEMORY_UTILIZATION``, both in the home.

Number literals given to a knob's name that are not its default are listed in
:data:`NOT_DEFAULTS` with the reason; repeated defaults left in modules other engineers are
changing now are listed in :data:`PENDING` (issue 37), so that any *new* one fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("rpeg", "flows", "tasks", "infra")
HOME = "rpeg/defaults.py"  # the one module that writes the knobs' defaults
SCHEMA = "rpeg/config"  # the package holding RunConfig's sections (reads HOME)

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
    "val_every": ("val_every",),
    # issue 37: the knobs below had their default repeated (config, IR recipes, runtime
    # functions, infra, plan builders) before they moved to the home
    "clip_low": ("clip_low",),
    "clip_high": ("clip_high",),
    "entropy_coef": ("entropy_coef",),
    "gamma": ("gamma",),
    "gae_lambda": ("gae_lambda", "lam"),
    "value_clip": ("value_clip",),
    "mismatch_threshold": ("mismatch_threshold",),
    "overlong_penalty_tokens": ("overlong_penalty_tokens",),
    "temperature": ("temperature",),
    "keep_last": ("keep_last",),
    "torch_threads": ("torch_threads",),
    "n_workers": ("n_workers",),
    "threads_per_worker": ("threads_per_worker",),
    "gpu_memory_utilization": ("gpu_memory_utilization",),
}

#: knobs of a plan unit, not of the run config: their schema field is in the plan schema
PLAN_KNOBS = ("gpu_memory_utilization",)
PLAN_SCHEMA = "rpeg/plan/schema.py"

#: (path, knob, literal) -> why that number, given to one of the knob's names, is no default
NOT_DEFAULTS = {
    ("rpeg/ir/recipes.py", "clip_high", "0.28"): "DAPO's own clip-higher (a recipe's value)",
    ("rpeg/runtime/model_io/value_heads.py", "keep_last", "0"): (
        "another knob of the same name: the sequence positions a value head returns"
    ),
    ("infra/cluster.py", "n_workers", "-1"): "Dask's scheduler_info(n_workers=-1): all workers",
    ("infra/slurm_cluster.py", "n_workers", "-1"): "the same Dask argument",
}

#: repeated defaults left to move into rpeg/defaults.py (none now); an entry allows that
#: literal in that module, any other site fails.
PENDING: set[tuple[str, str, str]] = set()


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


def _key(site: str, knob: str) -> tuple[str, str, str]:
    """``path:line (name=value)`` -> (path, knob, value)."""
    path = site.split(":", 1)[0]
    return path, knob, site.rsplit("=", 1)[1].rstrip(")")


def test_no_knob_has_a_number_default_anywhere_but_its_home():
    sites = default_sites(_product_files(), ROOT)
    found = {
        knob: [s for s in v if _key(s, knob) not in NOT_DEFAULTS and _key(s, knob) not in PENDING]
        for knob, v in sites.items()
    }
    assert {k: v for k, v in found.items() if v} == {}


def test_the_listed_exceptions_still_exist():
    """An exception whose site is gone (moved to the home, or renamed) is removed from the
    lists, so that the lists say what is left."""
    sites = default_sites(_product_files(), ROOT)
    seen = {_key(s, knob) for knob, v in sites.items() for s in v}
    assert set(NOT_DEFAULTS) - seen == set()
    assert PENDING - seen == set()


def test_the_home_writes_each_knob_once_and_imports_nothing():
    tree = ast.parse((ROOT / HOME).read_text())
    assigned = [
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    ]
    for knob in KNOBS:
        assert assigned.count(knob.upper()) == 1, knob
    assert len(assigned) == len(set(assigned))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def _schema_fields() -> dict[str, ast.AST]:
    """Knob -> the default expression of its field in the schema (``Field``'s first argument):
    the run config's sections, and the plan schema for :data:`PLAN_KNOBS`."""
    out: dict[str, ast.AST] = {}
    for f in [*sorted((ROOT / SCHEMA).rglob("*.py")), ROOT / PLAN_SCHEMA]:
        plan = f == ROOT / PLAN_SCHEMA
        for node in ast.walk(ast.parse(f.read_text())):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id in KNOBS
                and (node.target.id in PLAN_KNOBS) == plan
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "Field"
            ):
                assert node.target.id not in out, f"{node.target.id} twice in the schema"
                out[node.target.id] = node.value.args[0]
    return out


def test_the_schema_fields_read_the_home():
    fields = _schema_fields()
    assert sorted(fields) == sorted(KNOBS)
    for knob, expr in fields.items():
        assert ast.unparse(expr) == f"defaults.{knob.upper()}", knob


def test_a_run_config_has_the_homes_values():
    """Hand-written values (the documented defaults), so a changed default is a visible diff."""
    from rpeg import defaults
    from rpeg.config import RunConfig

    c = RunConfig()
    assert (c.workload.num_prompts, c.workload.samples_per_prompt) == (16, 8)
    assert (c.workload.max_prompt_tokens, c.workload.max_response_tokens) == (32, 16)
    assert (c.workload.train_minibatches, c.workload.micro_batch_size) == (4, 64)
    assert (c.algorithm.kl_coef, c.optim.lr) == (0.0, 1e-4)
    assert (c.runtime.max_staleness, c.runtime.checkpoint_every) == (0, 10)
    assert c.workload.micro_batch_size == defaults.MICRO_BATCH_SIZE
    a = c.algorithm
    assert (a.clip_low, a.clip_high, a.entropy_coef, a.value_clip) == (0.2, 0.2, 0.0, 0.2)
    assert (a.gamma, a.gae_lambda) == (1.0, 0.95)
    assert (a.rollout_correction.mismatch_threshold, a.overlong_penalty_tokens) == (0.2, 0)
    assert (c.workload.temperature, c.runtime.keep_last, c.runtime.torch_threads) == (1.0, 3, 1)
    assert (c.cluster.n_workers, c.cluster.threads_per_worker) == (2, 1)


def test_a_plan_units_kv_cache_share_has_the_homes_values():
    """0.8 where a plan does not say; 0.6 in the colocated builder (the trainer's state stays
    resident beside the engine), 0.8 in the disaggregated one."""
    from rpeg.ir import build
    from rpeg.plan.schema import UnitPlan, colocated_plan, disaggregated_plan

    assert UnitPlan(devices="0").gpu_memory_utilization == 0.8
    g = build("grpo")
    col = colocated_plan(g, num_devices=2).units["generate"].gpu_memory_utilization
    dis = disaggregated_plan(g, gen_devices=1, train_devices=1).units["generate"]
    assert (col, dis.gpu_memory_utilization) == (0.6, 0.8)


def test_the_ir_builders_default_to_the_configs_values():
    """rpeg.ir may not import the config: its builders read the same home."""
    from rpeg.config import RunConfig
    from rpeg.ir import build

    c = RunConfig()
    g = build("grpo")
    assert g.staleness == c.runtime.max_staleness
    assert g.params["kl_coef"] == c.algorithm.kl_coef
    assert g.params["group_size"] == c.workload.samples_per_prompt
    from rpeg.ir.recipes import KNOBS as RECIPE

    for knob in ("clip_low", "clip_high", "entropy_coef", "gamma", "gae_lambda", "value_clip"):
        assert getattr(RECIPE, knob) == getattr(c.algorithm, knob), knob


def test_the_scan_finds_each_kind_of_default(tmp_path):
    """A hand-written module with one default of each kind; the schema is not exempt, and a
    field reading the home is not a default."""
    (tmp_path / "rpeg" / "config").mkdir(parents=True)
    (tmp_path / "rpeg" / "config" / "workload.py").write_text(
        "class W:\n    micro_batch_size: int = Field(64, ge=1)\n"
        "    max_staleness: int = Field(defaults.MAX_STALENESS, ge=0)\n"
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
