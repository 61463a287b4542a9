"""RPEG's expert parallelism priced as the runtime runs it (rpeg.runtime.expert_parallel;
docs/perf-model.md): on an FSDP trainer at ep > 1 each rank loops over its E/ep experts,
FSDP gathers only the non-expert parameters, the rank holds its experts whole; and a run
config's own plan section with a model folder prices the folder, not the built-in model."""

from __future__ import annotations

import pytest

from rpeg.config import RunConfig
from tests.runtime.models.tiny_folders import write_tiny_folder


def _config(folder, ep: int) -> RunConfig:
    units = {u: {"devices": "0-1"} for u in ("generate", "reward", "advantage", "sync_weights")}
    for u in ("ref_logprob", "old_logprob", "train_actor"):
        units[u] = {"devices": "0-1", "engine": "fsdp", "ep": ep}
    return RunConfig.from_dict(
        {
            "model": {"path": str(folder)},
            "workload": {"num_prompts": 4, "samples_per_prompt": 4, "max_response_tokens": 16},
            "cluster": {"name": "local-cpu", "n_workers": 2, "num_devices": 2},
            "plan": {"cluster": "local-cpu", "graph": {"builder": None}, "units": units},
        }
    )


def _predict(cfg):
    from rpeg.cli.perf import folder_plan
    from rpeg.compile.sources import resolve
    from rpeg.perf import predict
    from rpeg.perf.prediction import Workload
    from rpeg.specs.hf import priced_model

    graph, plan = resolve(None, cfg)
    plan = folder_plan(plan, cfg)
    spec = priced_model(cfg.model)
    assert plan.model == spec.name  # the folder's, not rpeg-tiny
    wl = Workload.from_config(cfg.workload, cfg.model.lora, cfg.task.multiturn)
    return spec, predict(graph, plan, wl, model=spec)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_folder("qwen3_moe", tmp_path_factory.mktemp("ep") / "moe")


def test_ep2_on_fsdp_loops_over_half_the_experts_gathers_the_rest_and_holds_its_experts(folder):
    spec, one = _predict(_config(folder, 1))
    _, two = _predict(_config(folder, 2))
    t1, t2 = one.stages["train_actor"], two.stages["train_actor"]
    assert t2.detail["moe_expert_loop_s"] == pytest.approx(t1.detail["moe_expert_loop_s"] / 2)
    experts = spec.moe_layers * spec.moe.experts * spec.expert_params
    rest = spec.params - experts
    from rpeg.perf.prediction import GB

    gb = 4 / GB  # fp32 weights on CPU
    assert t1.memory_gb["weights"] == pytest.approx(spec.params / 2 * gb)  # FSDP over dp=2
    assert t2.memory_gb["weights"] == pytest.approx((rest / 2 + experts / 2) * gb)
    assert sum(t2.comm_s.values()) > 0  # the all-to-alls
    assert "ep_expert_grad_sync_s" not in t2.detail  # dp = ep: no replicas to sum over
