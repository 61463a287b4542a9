"""The device check: a few GRPO steps through the real runtime (Prefect flow -> Dask worker ->
RankActor), with the performance model's prediction for the same plan next to what it measured.

    python3 scripts/gpu_check.py [--device cuda|cpu] [--steps N] [--json FILE] [--out DIR]

``--device cuda`` (default): one NVIDIA GPU, bf16, a Qwen2-0.5B-shaped model (hidden 896,
24 layers, 14 heads, 2 KV heads, MLP 4864; 358M parameters outside the embeddings) on the
project's character-level tokenizer (vocab 100), random init: rewards stay near 0, which does
not matter for throughput. The prediction prices that model as it runs (the built-in model at
its ``tiny_shape``: rpeg.specs.hf.tiny_model, the torch engine, the plan the run compiles) on
the catalog cluster named after the GPU; each rank's predicted peak memory is the run
summary's (rpeg.compile.memory). ``--margin`` (0.5 on cuda): exit 3 when the median step or a
rank's peak is off its prediction by more; ``--gpu-tests``: the gpu-marked tests after it,
in the same window (exit 4 when they fail).

``--device cpu``: the CPU rehearsal of the same path (scripts/device_rehearsal.sh runs it on
every commit): two ranks on gloo, fp32, a 2-layer tiny model, priced on ``local-cpu``.

Prints per stage (execution unit) the measured median seconds and tokens/s beside the
prediction, and each group's peak memory beside the predicted peak per device; writes the
figures to ``--json`` (default ``OUT/gpu_check.json``). Installs and downloads nothing: on a
machine without internet install the device kit first (scripts/device_kit.sh, docs/runtime.md
"GPU check"). Exit 1 when the device asked for is not usable (the reason is printed).

A file, not a heredoc: Dask's Nanny re-imports ``__main__`` from its path in every worker
process (``python - <<EOF`` has none: "Nanny failed to start"), so everything that starts the
run is under the ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

#: GPU name fragment -> catalog cluster (rpeg/specs); the first match wins (GH200 before H200)
GPU_CLUSTERS = (
    ("GH200", "gh200-alps"),
    ("H200", "dgx-h200"),
    ("H100", "dgx-h100"),
    ("H800", "h800-cluster"),
    ("H20", "h20-cluster"),
    ("A100", "dgx-a100"),
)
#: the shape of Qwen2-0.5B's transformer (built with random weights on the GPU)
QWEN05_SHAPE = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
#: the CPU rehearsal's model: 2 layers, small enough for two ranks on a shared 2-core CI box
TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


def cluster_for(gpu_name: str) -> str:
    """The catalog cluster of a GPU by its name (``dgx-h100`` when none matches)."""
    return next((c for k, c in GPU_CLUSTERS if k in gpu_name), "dgx-h100")


def check_config(device: str, steps: int, out: Path, cluster: str) -> dict[str, Any]:
    """The run config of the check (a dict for ``RunConfig.from_dict``)."""
    if device == "cuda":
        model = {"name": "rpeg-tiny", "tiny_shape": QWEN05_SHAPE}
        work = {"num_prompts": 16, "samples_per_prompt": 8, "max_prompt_tokens": 32,
                "max_response_tokens": 128, "micro_batch_size": 32, "train_minibatches": 2,
                "precision": "bf16"}  # fmt: skip
        cl = {"name": cluster, "num_devices": 1, "n_workers": 1}
    else:
        model = {"name": "rpeg-tiny", "tiny_shape": TINY_SHAPE}
        work = {"num_prompts": 4, "samples_per_prompt": 2, "max_prompt_tokens": 16,
                "max_response_tokens": 8, "micro_batch_size": 8, "train_minibatches": 1,
                "precision": "fp32"}  # fmt: skip
        cl = {"name": "local-cpu", "num_devices": 2, "n_workers": 2}
    return {
        "model": model,
        "algorithm": {"name": "grpo", "kl_coef": 0.001},
        "workload": work,
        "optim": {"warmup_sft_steps": 0},
        "cluster": cl,
        "runtime": {"steps": steps, "output_dir": str(out / "run"), "checkpoint_url": None},
    }


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def stage_rows(history: list[dict[str, Any]], pred: dict[str, Any]) -> list[dict[str, Any]]:
    """Per execution unit: measured median seconds and tokens/s (the step's tokens, prompt and
    response, over the unit's time, as the prediction counts them; generation also its
    engine's generated tokens/s), and the prediction's."""
    rows = []
    for name, st in pred["stages"].items():
        secs = [h[f"unit_s/{name}"] for h in history if f"unit_s/{name}" in h]
        tokens = _median([float(h.get("num_tokens", 0.0)) for h in history])
        measured_s = _median(secs) if secs else None
        gen = "generate" in st["kinds"]
        p_s = float(st["time_s"])
        rows.append({
            "stage": name,
            "measured_s": measured_s,
            "measured_tokens_per_s": tokens / measured_s if measured_s else None,
            # the engine's own figure: generated (response) tokens per second of decoding
            "measured_gen_tokens_per_s": _median(
                [float(h.get("gen_tokens_per_s", 0.0)) for h in history]) if gen else None,
            "predicted_s": p_s,
            "predicted_tokens_per_s": float(pred["tokens_per_step"]) / p_s if p_s > 0 else None,
            "predicted_peak_memory_gib": float(st["peak_memory_gb"]) * 1e9 / 2**30,
        })  # fmt: skip
    return rows


def memory_rows(summary: dict[str, Any], pred: dict[str, Any]) -> list[dict[str, Any]]:
    """Per group and rank: the measured peak (device allocator on a GPU, else the process's
    resident set) beside the rank's predicted peak (the run summary's
    ``predicted_peak_memory``: rpeg.compile.memory), else the largest predicted peak per
    device of the unit prices."""
    unit_peak = max(pred["device_memory_gb"].values(), default=0.0) * 1e9 / 2**30
    per_rank = summary.get("predicted_peak_memory") or {}
    rows = []
    for group, ranks in (summary.get("peak_memory") or {}).items():
        rank_peak = (per_rank.get(group) or {}).get("peak_gb")
        predicted = unit_peak if rank_peak is None else rank_peak * 1e9 / 2**30
        for r, m in enumerate(ranks):
            dev = m.get("peak_device_bytes")
            rows.append({
                "group": group, "rank": r, "device": m.get("device"),
                "measured_peak_gib": (dev if dev is not None else m.get("peak_rss_bytes", 0))
                / 2**30,
                "what": "device allocator" if dev is not None else "process resident set",
                "predicted_peak_gib": predicted,
            })  # fmt: skip
    return rows


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def report(result: dict[str, Any]) -> str:
    lines = [f"{'stage':16s} {'measured s':>11s} {'predicted s':>12s} "
             f"{'measured tok/s':>15s} {'predicted tok/s':>16s} {'pred. GiB':>10s}"]  # fmt: skip
    for r in result["stages"]:
        lines.append(
            f"{r['stage']:16s} {_fmt(r['measured_s'], '11.3f')} {_fmt(r['predicted_s'], '12.3f')} "
            f"{_fmt(r['measured_tokens_per_s'], '15.0f')} "
            f"{_fmt(r['predicted_tokens_per_s'], '16.0f')} "
            f"{_fmt(r['predicted_peak_memory_gib'], '10.2f')}"
        )
    for m in result["memory"]:
        lines.append(
            f"peak memory {m['group']} rank {m['rank']} ({m['device']}, {m['what']}): "
            f"{m['measured_peak_gib']:.2f} GiB measured, {m['predicted_peak_gib']:.2f} GiB "
            "predicted"
        )
    lines.append(
        f"step: {result['step_s']:.2f} s measured (median after the first), "
        f"{result['predicted_step_s']:.2f} s predicted; wall {result['wall_s']:.0f} s "
        f"for {result['steps']} steps"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="gpu-check", help="run folder (metrics, summary)")
    ap.add_argument("--json", default=None, help="figures (default OUT/gpu_check.json)")
    ap.add_argument(
        "--margin",
        type=float,
        default=None,
        help="exit 3 when the median step or a rank's peak memory is off the prediction by "
        "more than this share (default: 0.5 on cuda; none on cpu, whose rehearsal runs on "
        "loaded CI machines)",
    )
    ap.add_argument(
        "--gpu-tests",
        action="store_true",
        help="then run the gpu-marked tests (python -m pytest -m gpu tests) in the same window",
    )
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error("--steps must be >= 1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # a fresh environment's first Prefect API start migrates its database: more than Prefect's
    # 20 s on a loaded machine (measured: "Timed out while attempting to connect to ephemeral
    # Prefect API server" in the rehearsal at load ~16 on 2 cores)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    import torch

    if a.device == "cuda":
        if not torch.cuda.is_available():
            print(f"gpu_check: no CUDA device visible to torch (torch {torch.__version__}, "
                  f"cuda {torch.version.cuda})", file=sys.stderr)  # fmt: skip
            return 1
        name = torch.cuda.get_device_name(0)
        cluster = cluster_for(name)
        price_model = "qwen2.5-0.5b-instruct"
    else:
        name, cluster, price_model = "cpu", "local-cpu", "rpeg-tiny"
    print(f"device: {name} (catalog cluster {cluster}); torch {torch.__version__}, "
          f"cuda {torch.version.cuda}; python {sys.version.split()[0]}")  # fmt: skip
    try:
        import prefect  # noqa: F401
    except ImportError:
        print("gpu_check: Prefect is not installed; the runtime runs inside the Prefect flow "
              "(build the kit with Prefect: the default of scripts/device_kit.sh)",
              file=sys.stderr)  # fmt: skip
        return 1

    from rpeg.flows.entry import train_on

    from rpeg.compile import compile_plan, resolve
    from rpeg.config import RunConfig
    from rpeg.perf import Workload, predict_plan

    cfg = RunConfig.from_dict(check_config(a.device, a.steps, out, cluster))
    compiled = compile_plan(None, cfg)
    for g in compiled.actor_groups:
        if g.device_type != a.device:
            print(f"gpu_check: group {g.name} compiled for {g.device_type}, not {a.device}",
                  file=sys.stderr)  # fmt: skip
            return 1
        print(f"plan: group {g.name} on devices {g.devices} ({g.device_type}, {g.dtype}, "
              f"backend {g.backend}, dp={g.dp} tp={g.tp})")  # fmt: skip
    # the plan the run compiles, naming the model that runs (the tiny_shape is priced at its
    # shape: rpeg.specs.hf.tiny_model), on the catalog cluster of the GPU
    _, plan = resolve(None, cfg)
    plan = plan.model_copy(update={"cluster": cluster, "num_nodes": 1})
    price_model = plan.model
    pred = predict_plan(plan, Workload.from_config(cfg.workload), algorithm=cfg.algorithm)
    pd = pred.to_dict() | {"timeline": None}

    t0 = time.perf_counter()
    summary = train_on(None, cfg, progress=False, summary_json=str(out / "summary.json"))
    wall = time.perf_counter() - t0
    full = summary["_extra"]["history"]
    hist = full[1:] or full  # the first step warms up (allocator, kernels)
    result = {
        "device": name,
        "cluster": cluster,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "flow": "prefect",
        "steps": len(full),
        "wall_s": wall,
        "step_s": _median([float(h["step_s"]) for h in hist]),
        "predicted_step_s": float(pred.step_s),
        "stages": stage_rows(hist, pd),
        "memory": memory_rows(summary, pd),
        "predicted_model": price_model,
        "predicted": pd,
    }
    margin = a.margin if a.margin is not None else (0.5 if a.device == "cuda" else None)
    result["margin"] = margin
    result["off"] = off_margin(result, margin)
    print(report(result))
    path = Path(a.json) if a.json else out / "gpu_check.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))
    print(f"figures: {path}")
    rc = 0
    for line in result["off"]:
        print(f"gpu_check: past the margin {margin:.0%}: {line}", file=sys.stderr)
        rc = 3
    if a.gpu_tests:
        import subprocess

        tests = subprocess.call([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "tests"])
        print(f"gpu-marked tests: exit {tests}")
        rc = rc or (4 if tests not in (0, 5) else 0)
    return rc


def off_margin(result: dict[str, Any], margin: float | None) -> list[str]:
    """What is off its prediction by more than ``margin`` (a share): the median step, each
    rank's peak memory."""
    if margin is None:
        return []
    out = []
    pairs = [("step", result["step_s"], result["predicted_step_s"])]
    pairs += [
        (
            f"peak memory {m['group']} rank {m['rank']}",
            m["measured_peak_gib"],
            m["predicted_peak_gib"],
        )
        for m in result["memory"]
    ]
    for what, got, want in pairs:
        if want and abs(got / want - 1) > margin:
            out.append(f"{what}: {got:.3g} measured, {want:.3g} predicted ({got / want - 1:+.0%})")
    return out


if __name__ == "__main__":
    sys.exit(main())
