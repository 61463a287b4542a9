#!/usr/bin/env bash
# GPU check: GRPO steps of a ~0.5B Qwen2-shaped model on one NVIDIA GPU, through the real
# runtime (Prefect flow -> Dask worker -> RankActor on cuda:0, bf16), with the performance
# model's prediction for the same plan printed next to the measurement.
#
# Needs: one NVIDIA GPU, a CUDA build of torch (already installed: this script never
# installs or downloads anything, the model is built from its shape with random weights), and
# the project installed (`pip install -e .`). Wheels it needs besides torch: the project's
# own dependencies (transformers, dask + distributed, prefect, pydantic, pyyaml, typer, rich,
# fsspec); dask-cuda is optional (used by infra/cluster.py when present; without it the one
# worker of a LocalCluster sees the GPU as cuda:0). No vLLM, no flash-attn.
#
# The model: Qwen2-0.5B's transformer shape (hidden 896, 24 layers, 14 heads, 2 KV heads,
# MLP 4864; 358M parameters outside the embeddings) on the project's character-level
# tokenizer (vocab 100 instead of 151,936), random init (no warm-up): rewards stay near 0,
# which does not matter for throughput. The prediction prices the catalog's
# qwen2.5-0.5b-instruct (its 151k-token vocabulary makes the LM head ~136M parameters more).
#
# Usage: scripts/gpu_check.sh [STEPS] [OUT_DIR]        (defaults: 3, ./gpu-check)
# Budget: < 8 minutes on an H100/H200 (actor start + 3 steps + the prediction).
set -euo pipefail
STEPS="${1:-3}"
OUT="${2:-gpu-check}"
mkdir -p "$OUT"
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false OMP_NUM_THREADS=1

python - "$STEPS" "$OUT" <<'PY'
import json, sys, time
from pathlib import Path

steps, out = int(sys.argv[1]), Path(sys.argv[2])
import torch

if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible to torch (torch %s, cuda %s)" % (
        torch.__version__, torch.version.cuda))
name = torch.cuda.get_device_name(0)
cluster = next((c for k, c in (("H200", "dgx-h200"), ("H100", "dgx-h100"), ("A100", "dgx-a100"),
                               ("H800", "h800-cluster"), ("H20", "h20-cluster"),
                               ("GH200", "gh200-alps")) if k in name), "dgx-h100")
print(f"device: {name} (catalog cluster {cluster}); torch {torch.__version__}, cuda {torch.version.cuda}")

from rpeg.config import RunConfig

cfg = RunConfig.from_dict({
    "model": {"name": "rpeg-tiny",  # the built-in architecture, at the shape below
              "tiny_shape": {"hidden_size": 896, "intermediate_size": 4864,
                             "num_hidden_layers": 24, "num_attention_heads": 14,
                             "num_key_value_heads": 2, "max_position_embeddings": 512}},
    "algorithm": {"name": "grpo", "kl_coef": 0.001},
    "workload": {"num_prompts": 16, "samples_per_prompt": 8, "max_prompt_tokens": 32,
                 "max_response_tokens": 128, "micro_batch_size": 32,
                 "train_minibatches": 2, "precision": "bf16"},
    "optim": {"warmup_sft_steps": 0},
    "cluster": {"name": cluster, "num_devices": 1, "n_workers": 1},
    "runtime": {"steps": steps, "output_dir": str(out / "run")},
})
from rpeg.compile import compile_plan, resolve

compiled = compile_plan(None, cfg)
g = compiled.actor_groups[0]
assert g.device_type == "cuda", g
print(f"plan: 1 group on device {g.devices} ({g.device_type}, {g.dtype}, backend {g.backend})")

from rpeg.flows.train import run_train

t0 = time.perf_counter()
summary = run_train(cfg, progress=False, summary_json=str(out / "summary.json"),
                    _with_extra=True)
wall = time.perf_counter() - t0
hist = summary["_extra"]["history"][1:] or summary["_extra"]["history"]  # drop the warm step
med = lambda xs: sorted(xs)[len(xs) // 2]
gen_tps = med([h.get("gen_tokens_per_s", 0.0) for h in hist])
train_tps = med([h.get("num_tokens", 0.0) / max(h.get("unit_s/train_actor", 1e-9), 1e-9)
                 for h in hist])
step_s = med([h["step_s"] for h in hist])
peak = summary.get("peak_memory", {}).get(g.name, [{}])[0]

from rpeg.perf import Workload, predict_plan

_, plan = resolve(None, cfg)
plan = plan.model_copy(update={"cluster": cluster, "model": "qwen2.5-0.5b-instruct",
                               "num_nodes": 1})
pred = predict_plan(plan, Workload.from_config(cfg.workload), algorithm=cfg.algorithm)
rows = [
    ("step s (median)", f"{step_s:.2f}", f"{pred.step_s:.2f}"),
    ("generation tokens/s", f"{gen_tps:.0f}", ""),
    ("training tokens/s", f"{train_tps:.0f}", f"{pred.tokens_per_s_per_gpu:.0f} (all tokens/s/GPU)"),
    ("peak GPU memory GiB", f"{peak.get('peak_device_bytes', 0) / 2**30:.1f}",
     f"{max(pred.device_memory_gb.values(), default=0):.1f}"),
]
print(f"{'':24s} {'measured':>12s} {'predicted':>30s}")
for r in rows:
    print(f"{r[0]:24s} {r[1]:>12s} {r[2]:>30s}")
print(f"wall {wall:.0f} s for {len(summary['_extra']['history'])} steps; summary: {out / 'summary.json'}")
(out / "gpu_check.json").write_text(json.dumps({
    "device": name, "step_s": step_s, "gen_tokens_per_s": gen_tps,
    "train_tokens_per_s": train_tps, "peak": peak, "predicted": pred.to_dict() | {"timeline": None},
}, indent=1, default=str))
PY
