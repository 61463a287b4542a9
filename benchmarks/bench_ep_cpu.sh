#!/bin/bash
# Expert parallelism priced vs measured on this machine (issue 40 item 5; docs/measurements.md):
# a random Qwen3-MoE of the built-in model's width (4 layers of 8 experts, top-2, h 256) as an HF
# folder, GRPO on the built-in task at fsdp dp=2 with ep=1 and ep=2 (2 CPU workers); one
# `rpeg calibrate` on an ep=1 run, then `rpeg bench` of each. Calibration goes to OUT/specs
# (RPEG_SPECS_DIR), not the user's. Usage: bash benchmarks/bench_ep_cpu.sh [OUT]
set -euo pipefail
OUT=${1:-runs/bench-ep}
mkdir -p "$OUT/specs"
OUT=$(cd "$OUT" && pwd)
export RPEG_SPECS_DIR="$OUT/specs"
python - "$OUT" <<'PY'
import sys
from tests.runtime.models.test_moe import LEARNER
from tests.runtime.models.tiny_folders import write_tiny_folder

out = sys.argv[1]
write_tiny_folder("qwen3_moe", f"{out}/moe", **LEARNER)
for ep in (1, 2):
    fwd = f"{{devices: 0-1, engine: fsdp, ep: {ep}}}"
    units = {u: "{devices: 0-1}" for u in ("generate", "reward", "advantage", "sync_weights")}
    units |= {"ref_logprob": fwd, "old_logprob": fwd, "train_actor": fwd}
    lines = [
        f"model: {{path: {out}/moe}}",
        "algorithm: {name: grpo}",
        "task: {kind: arithmetic, heldout_size: 8}",
        "workload: {num_prompts: 4, samples_per_prompt: 4, max_response_tokens: 16, "
        "train_minibatches: 1}",
        "cluster: {name: local-cpu, n_workers: 2, num_devices: 2}",
        "plan:",
        "  cluster: local-cpu",
        "  graph: {builder: null}",
        "  units:",
        *(f"    {u}: {v}" for u, v in units.items()),
        f"runtime: {{steps: 8, output_dir: {out}/runs/ep{ep}}}",
    ]
    open(f"{out}/ep{ep}.yaml", "w").write("\n".join(lines) + "\n")
PY
uptime
rpeg train "$OUT/ep1.yaml" runtime.steps=8 | tail -2
rpeg calibrate "$OUT/runs/ep1/latest" | tail -1
for ep in 1 2; do
  uptime
  rpeg bench "$OUT/ep$ep.yaml" --steps 6 --no-artifact --out "$OUT/bench-ep$ep" | tail -4
done
