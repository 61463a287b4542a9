"""``runtime.export_hf: true``: every checkpoint also written as an HF folder (issue 29)."""

from __future__ import annotations

import pytest
import torch

from rpeg.config import RunConfig
from tests.firstday.conftest import run_yaml


def test_local_run_exports_every_checkpoint(user_files, tmp_path):
    from transformers import AutoModelForCausalLM

    from rpeg.runtime.datasets.fit import fit_prompt_lengths
    from rpeg.runtime.export import export_dir
    from rpeg.runtime.local_trainer import LocalTrainer

    cfg = fit_prompt_lengths(RunConfig.from_yaml(run_yaml(user_files, tmp_path)))
    cfg = cfg.with_overrides(
        {"runtime.steps": 2, "runtime.checkpoint_every": 1, "runtime.export_hf": True}
    )
    trainer = LocalTrainer(cfg)
    trainer.run()
    hf = tmp_path / "out" / "hf"
    assert sorted(p.name for p in hf.iterdir()) == ["step-00000001", "step-00000002"]
    assert export_dir(cfg, 2) == str(hf / "step-00000002")
    ids = torch.tensor([[1, 70, 71, 72, 2, 5, 9]])
    with torch.no_grad():
        mine = trainer.actor.lm(input_ids=ids).logits
        last = AutoModelForCausalLM.from_pretrained(
            str(hf / "step-00000002"), trust_remote_code=False
        ).eval()
        first = AutoModelForCausalLM.from_pretrained(
            str(hf / "step-00000001"), trust_remote_code=False
        ).eval()
        assert torch.equal(last(input_ids=ids).logits, mine)  # the trained weights
        assert not torch.equal(first(input_ids=ids).logits, mine)  # one step earlier's


def test_a_failed_export_warns_and_the_run_goes_on(tmp_path):
    from rpeg.runtime.export import export_at_checkpoint

    cfg = RunConfig().with_overrides(
        {"runtime.export_hf": True, "runtime.output_dir": str(tmp_path / "o")}
    )
    with pytest.warns(UserWarning, match="runtime.export_hf: step 3 not exported"):
        assert export_at_checkpoint(cfg, str(tmp_path / "missing"), 3) is None
    off = cfg.with_overrides({"runtime.export_hf": False})
    assert export_at_checkpoint(off, str(tmp_path / "missing"), 3) is None
