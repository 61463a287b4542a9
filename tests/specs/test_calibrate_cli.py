"""`rpeg specs calibrate` measures this machine and the catalog loader then prefers it."""

import os

import yaml

from rpeg import specs
from rpeg.cli import main


def test_calibrate_writes_a_cpu_profile_the_loader_prefers(capsys):
    out = specs.user_specs_dir() / "gpus.yaml"  # the suite points RPEG_SPECS_DIR at a tmp dir
    assert os.environ["RPEG_SPECS_DIR"] in str(out)
    assert main(["specs", "calibrate", "--seconds", "0.2"]) == 0
    assert "GFLOP/s" in capsys.readouterr().out
    entry = yaml.safe_load(out.read_text())["gpus"]["cpu"]
    assert entry["bf16_dense_tflops"] > 0 and entry["hbm_tbps"] > 0
    assert entry["layer_overhead_ms"] > 0  # eager overhead measured with torch
    try:
        cpu = specs.gpu("cpu")
        assert cpu.layer_overhead_s == entry["layer_overhead_ms"] / 1e3
        assert "rpeg specs calibrate" in cpu.source
    finally:
        out.unlink()
        specs.reload()
