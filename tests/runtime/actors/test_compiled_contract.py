"""The contract between compile and the runtime (issue 27): the compiled step is frozen, typed
data (no dict, no Any); the runtime reads it as such (no dict lookups on it, no plan of its
own); one staleness rule serves both runtimes."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest

from rpeg.compile import step as S

ROOT = Path(__file__).resolve().parents[3]


# --------------------------------------------------------------------------- frozen, typed
def _leaves(tp) -> list:
    """Every type a field annotation is made of (through tuple[...], X | None, Literal)."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return [type(a) for a in typing.get_args(tp)]
    if origin in (tuple, types.UnionType, typing.Union):
        return [leaf for a in typing.get_args(tp) if a is not Ellipsis for leaf in _leaves(a)]
    if origin is not None:  # list[...], dict[...], set[...]: the container itself
        return [origin]
    return [tp]


def _walk(cls, seen: set) -> list[str]:
    """Why ``cls`` (or a spec it holds) is not frozen, typed data: one line per problem."""
    if cls in seen:
        return []
    seen.add(cls)
    if not dataclasses.is_dataclass(cls):
        return [f"{cls.__name__} is not a dataclass"]
    bad = [] if cls.__dataclass_params__.frozen else [f"{cls.__name__} is not frozen"]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        for leaf in _leaves(hints[f.name]):
            where = f"{cls.__name__}.{f.name}"
            if leaf is typing.Any or leaf is object:
                bad.append(f"{where}: Any")
            elif leaf in (dict, list, set):
                bad.append(f"{where}: a mutable {leaf.__name__}")
            elif dataclasses.is_dataclass(leaf):
                bad += _walk(leaf, seen)
            elif leaf not in (str, int, float, bool, type(None)) and not issubclass(leaf, str):
                bad.append(f"{where}: {leaf!r} is no plain value")
    return bad


def test_compiled_step_and_every_part_are_frozen_typed_dataclasses():
    seen: set = set()
    assert _walk(S.CompiledStep, seen) == []
    # the walk reached every part (so the assertion above covered them)
    assert {S.GroupSpec, S.TaskSpec, S.WeightSync, S.Buffer} <= seen


def test_the_walk_finds_what_it_refuses():
    """The checker itself: a mutable, dict-holding, Any-typed spec is reported."""

    @dataclasses.dataclass
    class Loose:
        a: dict[str, int]
        b: typing.Any
        c: list[int]

    assert _walk(Loose, set()) == [
        "Loose is not frozen",
        "Loose.a: a mutable dict",
        "Loose.b: Any",
        "Loose.c: a mutable list",
    ]


def test_a_compiled_step_cannot_be_changed_in_place(tmp_path):
    from rpeg.compile import compile_plan
    from rpeg.config import RunConfig

    step = compile_plan(None, RunConfig())
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.staleness = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.actor_groups[0].tp = 2  # type: ignore[misc]
    assert isinstance(step.tasks, tuple) and isinstance(step.tasks[0].kinds, tuple)


def test_the_yaml_form_round_trips_and_names_an_unknown_field():
    import yaml

    from rpeg.compile import CompiledStep, compile_plan
    from rpeg.config import RunConfig
    from rpeg.errors import ConfigError

    step = compile_plan(None, RunConfig().with_overrides({"runtime.max_staleness": 1}))
    d = yaml.safe_load(step.to_yaml())
    assert CompiledStep.from_dict(d) == step
    assert "max_staleness" not in d["buffer"] and d["staleness"] == 1  # k once
    d["actor_groups"][0]["gpus"] = 2
    with pytest.raises(ConfigError, match="actor_groups.gpus: unknown field"):
        CompiledStep.from_dict(d)
    del d["actor_groups"][0]["gpus"], d["tasks"][0]["micro_batch_size"]
    with pytest.raises(ConfigError, match="tasks.micro_batch_size: missing"):
        CompiledStep.from_dict(d)


# --------------------------------------------------------------------------- the runtime reads
#: what the runtime must not do with the compiled step (issue 27 "Done when")
FORBIDDEN = {
    r"group\.get\(": "a group read as a dict",
    r"compiled\.buffer\[": "the buffer read as a dict",
    r"config\.workload\.micro_batch_size": "the config's micro-batch size (the unit has its own)",
    r"\bstaleness_bound\(": "k from the config (the compiled step has it)",
    r"\bresolve\(None, ": "the plan resolved again (the compiled step is the plan)",
}
#: not yet moved onto the compiled step (the flow's performance-model prediction)
ALLOWED = {("rpeg/runtime/actors/predicted.py", r"\bresolve\(None, ")}


def _hits(pattern: str, root: Path = ROOT) -> list[str]:
    out = []
    for p in sorted((root / "rpeg" / "runtime").rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if (rel, pattern) in ALLOWED:
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(pattern, line):
                out.append(f"{rel}:{i}: {line.strip()}")
    return out


@pytest.mark.parametrize("pattern", sorted(FORBIDDEN))
def test_the_runtime_reads_the_compiled_step_as_typed_data(pattern):
    assert _hits(pattern) == [], FORBIDDEN[pattern]


def test_the_grep_sees_a_planted_line(tmp_path):
    """The grep above is not blind: a file with the pattern is reported."""
    pkg = tmp_path / "rpeg" / "runtime"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("k = group.get('max_staleness', 0)\n")
    got = _hits(r"group\.get\(", tmp_path)
    assert got == ["rpeg/runtime/x.py:1: k = group.get('max_staleness', 0)"]


def test_cpu_is_the_default_device_type_in_one_place():
    """ "cpu" as a device-type default (a parameter or field default, a ``.get`` fallback) is
    written once in compile and the runtime: rpeg.compile.step.DEFAULT_DEVICE_TYPE."""
    pat = re.compile(
        r"device_type\s*(:[^=\n]*)?=\s*\"cpu\"|\.get\(\s*\"device_type\"\s*,\s*\"cpu\""
    )
    assert pat.search('def f(device_type: str = "cpu"):') and pat.search(
        'g.get("device_type", "cpu")'
    )
    assert not pat.search('if mesh.device_type != "cpu":')
    hits = []
    for root in ("rpeg/compile", "rpeg/runtime", "tasks"):
        for p in sorted((ROOT / root).rglob("*.py")):
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if pat.search(line):
                    hits.append(f"{p.relative_to(ROOT)}:{i}")
    assert hits == []
    assert S.DEFAULT_DEVICE_TYPE == "cpu"


# --------------------------------------------------------------------------- one staleness rule
def test_within_bound_by_hand():
    from rpeg.runtime.step.staleness import within_bound

    # (step, generator version) -> admitted, for k = 0, 1, 2 (step - version <= k)
    table = {
        0: {(0, 0): True, (1, 0): False, (2, 1): False, (3, 3): True},
        1: {(0, 0): True, (1, 0): True, (2, 0): False, (3, 2): True},
        2: {(2, 0): True, (3, 0): False, (4, 2): True, (5, 2): False},
    }
    for k, cases in table.items():
        assert {c: within_bound(*c, k) for c in cases} == cases, k


def test_the_async_buffer_admits_by_the_same_rule():
    """StalenessState (the async runtime's buffer): a generator holding version 0 may
    generate slots 0..k and is blocked at slot k+1 (slot s iff s - 0 <= k)."""
    from rpeg.runtime.step import staleness as st

    for k, expect in {0: "AB", 1: "AAB", 2: "AAAB"}.items():
        state = st.StalenessState(k=k, batch_size=2)
        got = ""
        for _slot in range(k + 2):
            (ins,) = state.handle(st.RequestSlot(0, 2))
            got += "A" if isinstance(ins, st.Admit) else "B" if isinstance(ins, st.Block) else "?"
        assert got == expect, k


class _Engine:
    """An engine with weights of its own (not the trainer's module): refreshed by copy from
    the trainer's weight source (as vLLM's ``update_from``)."""

    def __init__(self):
        self.policy_version = 0
        self.updates = []

    def update_from(self, source, version, device=None):
        self.updates.append(version)
        self.policy_version = version


class _Actor:
    def __init__(self):
        self.engine, self.lm, self.policy_version = _Engine(), object(), 0
        self.device = None

    def weight_source(self):
        return {}, lambda name: None


class _Residency:
    def before_update(self):
        pass

    def after_update(self):
        pass


def _colocated_lags(k: int, steps: int) -> list[int]:
    """A colocated loop: generate with the engine's weights, train (version + 1), refresh
    by the shared rule; the lag each step trains at."""
    from rpeg.runtime.actors.weight_sync import refresh_lagging_engine

    a = _Actor()
    lags = []
    for _ in range(steps):
        lags.append(a.policy_version - a.engine.policy_version)
        a.policy_version += 1
        refresh_lagging_engine(a, _Residency(), k)
    return lags


def test_a_lagging_engine_is_refreshed_only_when_the_bound_needs_it():
    # hand-worked: k=0 refreshes after every update; k=1 lets the engine fall one version
    # behind (lags 0,1,0,1); k=2 two (0,1,2,0,1,2)
    assert _colocated_lags(0, 4) == [0, 0, 0, 0]
    assert _colocated_lags(1, 4) == [0, 1, 0, 1]
    assert _colocated_lags(2, 6) == [0, 1, 2, 0, 1, 2]


def test_both_runtimes_refresh_through_the_one_rule(monkeypatch):
    """The local trainer and a colocated rank run their units through the one stage loop
    (rpeg.runtime.stage_loop), whose sync_weights stage calls the one rule (behaviour:
    replacing it changes what both do)."""
    import rpeg.runtime.local_trainer as LT
    from rpeg.runtime import stage_loop as SL
    from rpeg.runtime.actors import weight_sync as W
    from rpeg.runtime.actors.rank_data import RankBatches
    from rpeg.runtime.actors.rank_units import RankUnits

    assert LT.StageLoop is SL.StageLoop and SL.weight_sync is W
    calls = []
    monkeypatch.setattr(W, "refresh_lagging_engine", lambda a, r, k: calls.append(k) or {})
    models = types.SimpleNamespace(
        inputs=None,
        actor=_Actor(),
        reference=None,
        critic=None,
        rewards=None,
        reduce=None,
        residency=_Residency(),
        offloader=None,
        k=2,
    )
    units = RankUnits(models, RankBatches())  # only its stage loop: a sync_weights stage
    m, spans = units.stage_loop().run_stages(["sync_weights"], {}, 0)
    assert calls == [2] and [s[0] for s in spans] == ["sync_weights"]


# --------------------------------------------------------------------------- the rank's surface
def test_the_rank_remote_surface_is_listed_apart_from_its_internals():
    """Every public method of RankActor is in rank.REMOTE and every listed name is one; the
    proxies and the data plane call nothing else on a rank. Each name but the actor's own
    is served by the method of that name of the part REMOTE lists it under."""
    from rpeg.runtime.actors.rank import REMOTE, RankActor

    listed = [n for names in REMOTE.values() for n in names]
    public = {
        n for n in dir(RankActor) if not n.startswith("_") and callable(getattr(RankActor, n))
    }
    assert sorted(listed) == sorted(public) and len(listed) == len(set(listed))
    for part, names in REMOTE.items():
        for n in names:
            route = vars(RankActor)[n]
            assert (part, n) == (("rank", n) if part == "rank" else (route.part, route.name))
    called = set()
    for f in ("proxies.py", "rank_data.py", "lifecycle.py"):
        text = (ROOT / "rpeg/runtime/actors" / f).read_text()
        called |= set(re.findall(r"\ba\.(\w+)\(", text))
    assert called and called <= set(listed), called - set(listed)


# --------------------------------------------------------------------------- compile reads no file
def test_compile_reads_no_model_file_and_checks_the_shape_it_is_given(tmp_path, monkeypatch):
    """A model folder's config.json is the caller's to read (rpeg.specs.hf.priced_model in the
    preflight): compile opens nothing under it, and checks tp against the spec it is passed
    (6 heads: tp=4 is refused naming them)."""
    import builtins
    import json
    from types import SimpleNamespace

    from rpeg.compile import compile_plan
    from rpeg.config import RunConfig
    from rpeg.errors import ConfigError
    from rpeg.ir import build
    from rpeg.plan import colocated_plan

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"num_attention_heads": 6}))
    cfg = RunConfig().with_overrides(
        {"model.path": str(folder), "cluster.n_workers": 4, "workload.num_prompts": 4}
    )
    plan = colocated_plan(build("grpo"), num_devices=4, tp=4)
    opened = []
    real_open = builtins.open

    def spy(file, *a, **k):
        opened.append(str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", spy)
    shape = SimpleNamespace(heads=6, kv_heads=6, ffn_hidden=128)
    with pytest.raises(ConfigError, match="tp=4 does not divide the model's num_attention_heads=6"):
        compile_plan(plan, cfg, model=shape)
    compile_plan(colocated_plan(build("grpo"), num_devices=4), cfg, model=shape)  # tp=1: fine
    assert not [p for p in opened if p.startswith(str(folder))]
