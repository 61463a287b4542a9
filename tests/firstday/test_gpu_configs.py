"""The GPU example configs (issue 41, item 8): one GPU with a ~0.5B model, one node of 8 GPUs,
a two-node plan. Each passes ``rpeg config show``, ``rpeg predict CONFIG`` (its own plan and
workload) and the compile check ``rpeg train`` runs before it starts; each says in its header
that it is untested on hardware, and docs/runtime.md lists them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rpeg.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*gpu*.yaml"))


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_the_three_shapes_ship():
    """one GPU (a model of at most ~1B), one node of 8, two nodes"""
    from rpeg import specs

    shapes = set()
    for path in CONFIGS:
        d = _load(path)
        n, nodes = d["cluster"]["num_devices"], d["plan"]["num_nodes"]
        if n == 1:
            assert specs.model(d["model"]["name"]).params < 1.0e9, path.name
        shapes.add((n, nodes))
    assert {(1, 1), (8, 1), (16, 2)} <= shapes


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_show_and_predict(path, capsys):
    assert main(["config", "show", str(path)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["cluster"]["num_devices"] == _load(path)["cluster"]["num_devices"]
    assert main(["predict", str(path), "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    d = _load(path)
    assert pred["num_devices"] == d["cluster"]["num_devices"]
    assert 0 < pred["predicted_low_s"] <= pred["step_s"] <= pred["predicted_high_s"]
    from rpeg import specs

    hbm = specs.cluster(d["plan"]["cluster"]).gpu.hbm_gb
    assert pred["capacity_gb"] == hbm  # priced on the config's GPUs, not this machine's CPU
    for device, gb in pred["device_memory_gb"].items():  # every GPU's units fit its memory
        assert gb <= hbm, (device, gb, hbm)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_the_plan_compiles_as_rpeg_train_checks_it(path):
    from rpeg import specs
    from rpeg.compile import compile_plan
    from rpeg.preflight import load_config

    cfg = load_config(str(path))
    step = compile_plan(
        None, cfg, cluster_devices=cfg.cluster.num_devices, model=specs.model(cfg.model.name)
    )
    assert step is not None


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_untested_on_hardware_is_said(path):
    assert "UNTESTED ON HARDWARE" in path.read_text().split("\n", 1)[0]
    doc = (REPO / "docs" / "runtime.md").read_text()
    section = doc.split("## GPU example configs", 1)[1].split("\n## ", 1)[0]
    assert f"configs/{path.name}" in section and "untested" in section.lower()
