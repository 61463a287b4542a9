"""Configs of the pp/cp run tests: the built-in task on the built-in model widened to 8 layers,
every model unit of the plan at one pp/cp/tp layout on ``n`` CPU ranks (generation at tp 1:
a pp or cp group generates on its own whole copy, docs/parallelism.md)."""

from __future__ import annotations

from pathlib import Path

UNITS = ("generate", "reward", "ref_logprob", "old_logprob", "advantage", "train_actor")
MODEL_UNITS = ("ref_logprob", "old_logprob", "train_actor")
LAYERS = 8


def stage_config(
    tmp_path: Path,
    n: int = 2,
    *,
    pp: int = 1,
    cp: int = 1,
    tp: int = 1,
    schedule: str = "1f1b",
    engine: str = "auto",
    units_over: dict[str, dict] | None = None,
    **over,
):
    from tests.runtime.actors.conftest import tiny_config

    devs = f"0-{n - 1}"
    units: dict[str, dict] = {u: {"devices": devs} for u in (*UNITS, "sync_weights")}
    for u in MODEL_UNITS:
        units[u].update(tp=tp, pp=pp, cp=cp, pp_schedule=schedule)
    units["train_actor"]["engine"] = engine
    for u, extra in (units_over or {}).items():
        units[u].update(extra)
    d = {
        "cluster.num_devices": n,
        "cluster.n_workers": n,
        "workload.num_prompts": 4,
        "workload.samples_per_prompt": 2,
        "workload.train_minibatches": 2,
        "workload.micro_batch_size": 2,
        "optim.warmup_sft_steps": 0,
        "optim.lr": 1e-3,
        "model.tiny_shape": {"num_hidden_layers": LAYERS},
        "plan.cluster": "local-cpu",
        "plan.model": "rpeg-tiny",
        "plan.staleness": 0,
        "plan.units": units,
    }
    d.update(over)
    return tiny_config(tmp_path, **d)
