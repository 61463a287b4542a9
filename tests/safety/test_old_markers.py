"""Issue 44, item 6: ``--resume`` from a checkpoint whose commit marker predates the identity
fields (algorithm, staleness, layout) is refused before start, saying the marker is old and
what to do -- not a ``KeyError: 'g1-rank0.pt'`` 38 s after everything started."""

from __future__ import annotations

import hashlib
import json

from rpeg.config import RunConfig
from rpeg.preflight.places import check_places
from rpeg.runtime.actors.checkpoint import COMMIT, dumps


def _old_checkpoint(url, run_id="run-old"):
    step = url / run_id / "step-00000002"
    step.mkdir(parents=True)
    data = dumps({"trainer": {"step": 2}})
    (step / "trainer.pt").write_bytes(data)
    files = {"trainer.pt": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}
    # format 2, but none of the fields a resume compares
    (step / COMMIT).write_text(
        json.dumps({"format": 2, "step": 2, "run_id": run_id, "files": files})
    )


def _cfg(tmp_path, **over):
    return RunConfig().with_overrides(
        {
            "runtime.checkpoint_url": str(tmp_path / "ck"),
            "runtime.output_dir": str(tmp_path / "out"),
            "runtime.resume": True,
            "runtime.run_id": "run-old",
            **over,
        }
    )


def test_an_old_marker_is_refused_before_start_naming_what_to_do(tmp_path):
    _old_checkpoint(tmp_path / "ck")
    probs = [p for p in check_places(_cfg(tmp_path), local=True) if p.where == "--resume"]
    assert len(probs) == 1
    text = str(probs[0])
    assert "old commit marker" in text and "step 2 of run run-old" in text
    assert "--allow-change algorithm" in text and "--allow-change staleness" in text


def test_stating_every_field_resumes_it_as_before(tmp_path):
    _old_checkpoint(tmp_path / "ck")
    allow = ["algorithm", "staleness", "layout"]
    cfg = _cfg(tmp_path, **{"runtime.allow_change": allow})
    assert [p for p in check_places(cfg, local=True) if p.where == "--resume"] == []
