"""One validation pass before anything starts: every problem at once, exit 2, no traceback."""

from __future__ import annotations

import json

import pytest
import yaml

from rpeg.config import RunConfig
from rpeg.errors import ConfigError, Problem


def _write(tmp_path, d):
    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump(d))
    return str(p)


@pytest.fixture
def no_services(monkeypatch):
    """Fail the test if a cluster or the Prefect flow would start."""
    import rpeg.infra.cluster as cluster

    def boom(*a, **k):
        raise AssertionError("a cluster was started before the input was validated")

    monkeypatch.setattr(cluster, "start_cluster", boom)
    import rpeg.flows.train as ft

    monkeypatch.setattr(ft, "rl_train", boom)


def test_a_config_with_five_problems_reports_five_before_any_worker_starts(
    tmp_path, capsys, no_services
):
    from rpeg.cli import main

    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n[1,2]\n")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    cfg = {
        "model": {"name": "no-such-model"},
        "task": {
            "kind": "jsonl",
            "url": str(data),
            "rewards": ["exact_numeric", "no_such_reward"],
            "prompt_template": "Q: {question} A: {answer}",
        },
        "runtime": {"output_dir": str(blocker / "out")},
    }
    code = main(["train", _write(tmp_path, cfg), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "(5 problems)" in err, err
    for where in (
        "model.name",
        "task.rewards[1]",
        f"{data}:2",
        "task.prompt_template",
        "runtime.output_dir",
    ):
        assert f"  - {where}: " in err, (where, err)
    assert "rpeg-tiny" in err  # the known model names are listed
    assert "Traceback" not in err


def test_local_run_is_checked_the_same_way(tmp_path, capsys):
    from rpeg.cli import main

    cfg = {"task": {"rewards": ["nope"], "prompt_template": "{question"}}
    code = main(["train", _write(tmp_path, cfg), "--local", "--quiet", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "(2 problems)" in err, err


def test_config_and_inline_plan_problems_are_reported_together(tmp_path, capsys, no_services):
    """A schema problem in the run config no longer hides the inline plan's: both kinds --
    the plan's schema (an unknown field) and its layout rules (tp over 4 devices) -- come
    in the one error, the plan's under ``plan.``."""
    from rpeg.cli import main
    from rpeg.preflight import load_config

    plan = {"cluster": "local-cpu", "model": "rpeg-tiny", "units": {}}
    cfg = {"workload": {"num_prompts": -3}, "plan": plan}
    plan["units"] = {"generate": {"devices": "0-3", "tp": 2, "bogus": 1}}
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, cfg))
    assert [p.where for p in info.value.problems] == [
        "workload.num_prompts",
        "plan.units.generate.bogus",
    ]
    plan["units"] = {"generate": {"devices": "0-3", "tp": 3}}
    code = main(["train", _write(tmp_path, cfg), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "(2 problems)" in err, err
    assert "  - plan.units.generate: tp*pp*cp=3 must divide the 4 devices" in err, err
    # a valid config is loaded as it is; a broken one without an inline plan is unchanged
    assert load_config(_write(tmp_path, {"workload": {"num_prompts": 4}})).workload.num_prompts == 4
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, {"workload": {"num_prompts": -3}}))
    assert [p.where for p in info.value.problems] == ["workload.num_prompts"]


@pytest.mark.parametrize("target", ["blocker/summary.json", "folder"])
def test_an_unwritable_summary_file_is_refused_before_training(
    tmp_path, capsys, no_services, target
):
    from rpeg.cli import main

    (tmp_path / "blocker").write_text("x")  # a file where a folder would have to be
    (tmp_path / "folder").mkdir()
    path = str(tmp_path / target)
    code = main(["train", "--quiet", "--out", str(tmp_path / "out"), "--summary-json", path])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "  - --summary-json: " in err, err
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # nothing ran


def test_machine_limits_and_numbers(tmp_path, capsys, no_services):
    import os

    from rpeg.cli import main
    from rpeg.preflight import check_machine

    probs = check_machine(RunConfig.from_dict({"cluster": {"num_devices": 1000}}))
    assert [p.where for p in probs] == ["cluster.num_devices"]
    assert f"this machine has {len(os.sched_getaffinity(0))} CPUs" in probs[0].what
    # against an existing cluster the count is checked once connected, not against this machine
    assert (
        check_machine(
            RunConfig.from_dict({"cluster": {"num_devices": 1000, "address": "tcp://h:8786"}})
        )
        == []
    )
    tls = check_machine(RunConfig.from_dict({"cluster": {"address": "tls://h:8786"}}))
    assert [p.where for p in tls] == [
        "cluster.tls_ca_file",
        "cluster.tls_cert_file",
        "cluster.tls_key_file",
    ]
    bad = RunConfig.from_dict(
        {"cluster": {"dashboard_address": "everywhere", "worker_memory": "lots"}}
    )
    assert {p.where for p in check_machine(bad)} == {
        "cluster.dashboard_address",
        "cluster.worker_memory",
    }
    code = main(["train", _write(tmp_path, {"optim": {"lr": float("inf")}}), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "optim.lr" in err and "finite" in err, err


def test_every_bad_data_line_is_listed_up_to_a_limit(tmp_path):
    from rpeg.runtime.data import MAX_ROW_PROBLEMS, check_examples, load_examples

    f = tmp_path / "d.jsonl"
    good = json.dumps({"question": "q", "answer": "1"})
    f.write_text("\n".join([good, "[1,2]", "{not json", json.dumps({"q": 1}), good]) + "\n")
    probs = check_examples(str(f))
    assert [p.where for p in probs] == [f"{f}:2", f"{f}:3", f"{f}:4"]
    with pytest.raises(ConfigError) as ei:
        load_examples(str(f))
    assert len(ei.value.problems) == 3  # was: AttributeError on the list row
    many = tmp_path / "many.jsonl"
    many.write_text("[1]\n" * (MAX_ROW_PROBLEMS + 5))
    probs = check_examples(str(many))
    assert len(probs) == MAX_ROW_PROBLEMS + 1 and "5 more" in probs[-1].what


def test_model_path_must_be_a_model_folder(tmp_path):
    from rpeg.preflight import check_model

    (tmp_path / "m").mkdir()
    cfg = RunConfig.from_dict({"model": {"path": str(tmp_path / "m"), "name": "qwen3-8b"}})
    assert [p.what for p in check_model(cfg)] == [
        f"{str(tmp_path / 'm')!r} holds no config.json (not a Hugging Face model)"
    ]
    (tmp_path / "m" / "config.json").write_text("{}")
    assert check_model(cfg) == []
    named = RunConfig.from_dict({"model": {"name": "qwen3-8b"}})
    assert "has no weights here" in check_model(named)[0].what


def test_config_error_keeps_its_problems_across_the_dask_boundary():
    """A ConfigError raised in a worker process reached the user as one "problem" per
    character of its message ("(5911 problems): - p - r - o")."""
    distributed = pytest.importorskip("distributed")

    def fail():
        raise ConfigError([Problem("a.b", "first"), Problem("c", "second")], title="t")

    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        ) as lc,
        distributed.Client(lc) as client,
        pytest.raises(ConfigError) as ei,
    ):
        client.submit(fail, pure=False).result()
    assert ei.value.problems == (Problem("a.b", "first"), Problem("c", "second"))
    assert ei.value.title == "t"


def test_a_scheduler_address_nothing_listens_on_is_refused_at_once():
    import socket

    from rpeg.preflight import check_scheduler_reachable

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert check_scheduler_reachable(f"tcp://127.0.0.1:{port}") == []
    # the same port once nobody listens there: refused
    probs = check_scheduler_reachable(f"tcp://127.0.0.1:{port}")
    assert [p.where for p in probs] == ["cluster.address"]
    assert "no scheduler answers at" in probs[0].what and "refused" in probs[0].what
    assert check_scheduler_reachable("tcp://127.0.0.1")[0].what.endswith(
        "expected tcp://host:port or tls://host:port"
    )
    assert check_scheduler_reachable(None) == []
    assert check_scheduler_reachable("inproc://x") == []  # not a TCP address: not probed


@pytest.mark.parametrize(
    ("algo", "k", "refused"),
    [("grpo", 1, True), ("rloo", 1, True), ("grpo", 2, False), ("reinforce_pp", 1, False)],
)
def test_a_group_baseline_needs_a_group(algo, k, refused, tmp_path, capsys):
    """GRPO with one sample per prompt trained on zero advantages without a word; RLOO
    raised a bare ValueError after the model was built. Both are refused up front."""
    from rpeg.preflight import check_algorithm

    cfg = RunConfig().with_overrides(
        {"algorithm.name": algo, "workload.samples_per_prompt": k, "workload.train_minibatches": 1}
    )
    problems = check_algorithm(cfg)
    assert [p.where for p in problems] == (["workload.samples_per_prompt"] if refused else [])
    if refused:
        assert f"{algo} needs at least 2 samples per prompt (got 1)" in problems[0].what
        from rpeg.cli import main

        over = {"algorithm": {"name": algo}, "workload": {"samples_per_prompt": 1}}
        assert main(["train", _write(tmp_path, over), "--local", "--quiet"]) == 2
        assert "workload.samples_per_prompt" in capsys.readouterr().err


def test_machine_message_names_the_machines_cpus_not_the_floor(monkeypatch):
    """On a 2-core machine 4 one-thread CPU workers are allowed (the shipped 4-device
    configs), but the message says 2 CPUs, not 4 (issue 29)."""
    from rpeg.preflight import machine as P

    monkeypatch.setattr(P, "machine_cpus", lambda: 2)
    assert P.machine_device_limit() == 4
    probs = P.check_machine(RunConfig.from_dict({"cluster": {"num_devices": 8}}))
    assert [p.where for p in probs] == ["cluster.num_devices"]
    assert "8 local devices, but this machine has 2 CPUs (up to 4 " in probs[0].what
    assert P.check_machine(RunConfig.from_dict({"cluster": {"num_devices": 4}})) == []
    monkeypatch.setattr(P, "machine_cpus", lambda: 16)
    probs = P.check_machine(RunConfig.from_dict({"cluster": {"num_devices": 32}}))
    assert "this machine has 16 CPUs (one worker process per device)" in probs[0].what
