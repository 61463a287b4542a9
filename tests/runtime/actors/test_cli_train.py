"""``rpeg train`` refuses bad input before any actor (or Prefect, or Dask) starts: exit 2."""

from __future__ import annotations

import time

import pytest
import yaml


def _write(tmp_path, d):
    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump(d))
    return str(p)


def _plan_with_role(role: str | None) -> dict:
    from rpeg.compile.sources import graph_from_config
    from rpeg.config import RunConfig
    from rpeg.ir import to_dict
    from rpeg.plan import colocated_plan

    g = graph_from_config(RunConfig())
    d = to_dict(g)
    if role is not None:  # a model-based reward: valid IR, but no such role in the runtime
        d["params"]["reward"] = "model"
        for s in d["stages"]:
            if s["name"] == "reward":
                s["role"] = role
    plan = colocated_plan(g, num_devices=1)
    plan = plan.with_inline_graph(d)
    return plan.to_dict()


@pytest.mark.parametrize(
    "case,match",
    [
        ("checkpoint", "not writable"),
        ("devices", "but the cluster has 2"),
        ("role", "unknown role 'reward_model'"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(tmp_path, capsys, case, match):
    from rpeg.cli import main

    if case == "checkpoint":
        f = tmp_path / "file"
        f.write_text("x")
        d = {"runtime": {"checkpoint_url": str(f / "ck")}}
    elif case == "devices":
        plan = _plan_with_role(None)
        for u in plan["units"].values():
            u["devices"] = [0, 1, 2, 3]
        d = {"plan": plan}
    else:
        d = {"plan": _plan_with_role("reward_model")}
    t0 = time.perf_counter()
    code = main(["train", _write(tmp_path, d), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert match in err, err
    assert time.perf_counter() - t0 < 30  # refused up front, no cluster started
    assert not (tmp_path / "out" / "compiled_step.yaml").exists()
