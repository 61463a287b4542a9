"""A rank receives no config text (issue 37): the driver resolves what its ranks run once and
hands each rank its group's :class:`rpeg.compile.rank_program.RankProgram` (typed, frozen);
nothing in the rank's modules parses YAML or reads a RunConfig, and the engine rule runs on
the driver, once per group."""

from __future__ import annotations

import contextlib
import pickle
import re
from pathlib import Path

import pytest

from rpeg.compile import compile_plan
from rpeg.compile.rank_program import RankProgram, RoleInputs
from rpeg.config import RunConfig
from rpeg.runtime.actors.lifecycle import ActorSet
from rpeg.runtime.actors.programs import group_program
from tests.runtime.group_specs import group_spec

ROOT = Path(__file__).resolve().parents[3]
RANK_MODULES = [
    "rank.py",
    "rank_models.py",
    "rank_units.py",
    "rank_data.py",
    "rank_weights.py",
    "rank_checkpoints.py",
    "rank_holdings.py",
    "streaming.py",
]


class _Future:
    def __init__(self, value):
        self.value = value

    def result(self, timeout=None):
        return self.value


class _Client:
    """Records what ActorSet.start submits; answers ``run`` on every worker in process."""

    def __init__(self, vllm: bool = False):
        self.submitted: list[tuple] = []
        self.runs: list[str] = []
        self.vllm = vllm

    def as_current(self):
        return contextlib.nullcontext()

    def submit(self, cls, *args, **kwargs):
        self.submitted.append((cls, args, kwargs))
        return _Future(object())

    def run(self, fn, workers):
        self.runs.append(fn.__name__)
        if fn.__name__ == "vllm_importable":
            return {w: self.vllm for w in workers}
        return {w: fn() for w in workers}


class _Cluster:
    def __init__(self, client, n):
        self.client = client
        self.workers = [f"tcp://w{i}" for i in range(n)]


def test_a_rank_is_started_with_its_groups_program_and_no_config_text(monkeypatch):
    from rpeg.runtime.actors import proxies
    from rpeg.runtime.actors.rank import RankActor

    monkeypatch.setattr(proxies.RankGroup, "join_process_group", lambda self: None)
    cfg = RunConfig().with_overrides({"runtime.collective_timeout_s": 1234})
    compiled = compile_plan(None, cfg)
    client = _Client()
    actors = ActorSet(cfg, compiled, _Cluster(client, compiled.num_devices), False)
    actors.start()
    ranks = sum(g.world_size for g in compiled.actor_groups)
    assert len(client.submitted) == ranks
    for cls, args, kwargs in client.submitted:
        assert cls is RankActor
        program, rank = args  # the program and the rank index: nothing else
        assert isinstance(program, RankProgram) and isinstance(rank, int)
        assert not any(isinstance(a, str) for a in (*args, *kwargs.values()))
        assert program.group in compiled.actor_groups
        assert program.staleness == compiled.staleness
        assert program.collective_timeout_s == 1234.0 and program.engine == "torch"
        assert program.inputs == RoleInputs.of(cfg)
        assert pickle.loads(pickle.dumps(program)) == program  # travels through Dask
    # resolved once: a second start (a recovery) neither asks the workers nor prices again
    first = dict(actors.programs)
    asked = client.runs.count("vllm_importable")
    actors.start()
    assert actors.programs == first and client.runs.count("vllm_importable") == asked


def test_a_rank_refuses_config_text():
    from rpeg.runtime.actors.rank import RankActor

    with pytest.raises(TypeError, match="RankProgram.*receives no config"):
        RankActor(RunConfig().to_yaml(), 0)


def test_no_rank_module_reads_a_config():
    for name in RANK_MODULES:
        text = (ROOT / "rpeg/runtime/actors" / name).read_text()
        found = re.findall(r"from_yaml|RunConfig|\bconfig_yaml\b|yaml|\.config\.|rank_engine", text)
        assert found == [], f"{name}: {found}"


def test_the_engine_rule_runs_on_the_driver_with_the_workers_answer():
    g = group_spec("gen", [0], ["actor"], [], device_type="cuda", gen_engine="auto")
    cfg = RunConfig().with_overrides({"runtime.collective_timeout_s": 60})
    assert group_program(cfg, g, staleness=1, vllm_available=True).engine == "vllm"
    assert group_program(cfg, g, staleness=1, vllm_available=False).engine == "torch"
    cpu = group_spec("gen", [0], ["actor"], [], device_type="cpu")
    assert group_program(cfg, cpu, staleness=1, vllm_available=True).engine == "torch"
    with pytest.raises(ValueError, match="resolved engine"):
        RankProgram(
            group=g,
            staleness=0,
            async_rollout=False,
            engine="auto",
            collective_timeout_s=60.0,
            predicted_step_s=None,
            inputs=RoleInputs.of(cfg),
        )


def test_the_tls_files_are_the_clusters_by_the_one_rule(tmp_path):
    from rpeg.runtime.actors.store_tls import tls_files

    names = {k: str(tmp_path / f"{k}.pem") for k in ("ca", "cert", "key")}
    for f in names.values():
        Path(f).write_text("x")
    over = {f"cluster.tls_{k}_file": v for k, v in names.items()}
    over["runtime.collective_timeout_s"] = 60
    cfg = RunConfig().with_overrides(over)
    g = group_spec("g", [0], ["actor"], ["actor"])
    want = tls_files(cfg.cluster)
    assert group_program(cfg, g, staleness=0).tls_files == (
        want.ca_file,
        want.cert_file,
        want.key_file,
    )
    plain = RunConfig().with_overrides({"runtime.collective_timeout_s": 60})
    assert group_program(plain, g, staleness=0).tls_files is None
