"""The paper comparison, reproduced in the performance model (PREDICTIONS, not measurements).

RPEG-optimized plans vs verl-style and ReaL-style baselines (and AReaL-style), for GRPO and
PPO on dense models from 7B to 70B on GH200 clusters (4 GPUs per node) of 16 to 256 GPUs.
Every number is priced by the same analytical model (rpeg.perf); the paper's claims are
"up to 2.48x step latency vs verl, up to 2x vs ReaL, up to +30% utilization".

    python benchmarks/paper_comparison.py [--quick] [--json out.json] [--md out.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

MODELS = ["qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "llama3.1-70b"]
GPUS = [16, 32, 64, 128, 256]
ALGOS = ["grpo", "ppo"]
WORKLOAD = dict(num_prompts=512, samples_per_prompt=16, max_response_tokens=8192, max_staleness=2)


def run(models, gpus, algos) -> list[dict]:
    from rpeg.plan import InfeasiblePlan
    from rpeg.search import optimize

    rows = []
    for algo in algos:
        for m in models:
            for n in gpus:
                t0 = time.perf_counter()
                try:
                    r = optimize(model=m, gpu="gh200", gpus=n, algo=algo, **WORKLOAD)
                except InfeasiblePlan as exc:
                    rows.append(
                        {
                            "algo": algo,
                            "model": m,
                            "gpus": n,
                            "feasible": False,
                            "reason": str(exc)[:200],
                        }
                    )
                    print(f"{algo:4s} {m:14s} {n:4d}: no feasible plan")
                    continue
                row = {
                    "algo": algo,
                    "model": m,
                    "gpus": n,
                    "feasible": True,
                    "rpeg_step_s": r.best.step_s,
                    "rpeg_mfu": r.best.prediction.mfu,
                    "plan": r.best.describe(),
                    "search_s": time.perf_counter() - t0,
                }
                for k in ("verl", "real", "areal"):
                    b = r.baselines[k].candidate
                    row[f"{k}_step_s"] = b.step_s if b else None
                    row[f"{k}_mfu"] = b.prediction.mfu if b else None
                    row[f"speedup_{k}"] = b.step_s / r.best.step_s if b else None
                rows.append(row)
                f = lambda v: "  n/a" if v is None else f"{v:5.2f}"  # noqa: E731
                print(
                    f"{algo:4s} {m:14s} {n:4d}: {r.best.step_s:7.1f} s  vs verl {f(row['speedup_verl'])}x "
                    f"ReaL {f(row['speedup_real'])}x AReaL {f(row['speedup_areal'])}x  [{r.best.describe()}]",
                    flush=True,
                )
    return rows


def summarize(rows: list[dict]) -> str:
    ok = [r for r in rows if r.get("feasible")]
    lines = ["| baseline | cases | min | median | max | paper claim |", "|---|---|---|---|---|---|"]
    claims = {"verl": "up to 2.48x", "real": "up to 2x", "areal": "(not claimed)"}
    for k in ("verl", "real", "areal"):
        v = sorted(r[f"speedup_{k}"] for r in ok if r.get(f"speedup_{k}"))
        if v:
            lines.append(
                f"| {k} | {len(v)} | {v[0]:.2f}x | {statistics.median(v):.2f}x | {v[-1]:.2f}x | {claims[k]} |"
            )
        else:
            lines.append(f"| {k} | 0 | - | - | - | {claims[k]} |")
    rel = sorted(r["rpeg_mfu"] / r["verl_mfu"] - 1 for r in ok if r.get("verl_mfu"))
    pts = sorted(100 * (r["rpeg_mfu"] - r["verl_mfu"]) for r in ok if r.get("verl_mfu"))
    if rel:
        lines.append("")
        lines.append(
            f"Utilization (MFU) vs verl: relative change min {100 * rel[0]:+.0f}% / median "
            f"{100 * statistics.median(rel):+.0f}% / max {100 * rel[-1]:+.0f}%; absolute "
            f"{pts[0]:+.1f} / {statistics.median(pts):+.1f} / {pts[-1]:+.1f} points (paper: up to +30%)."
        )
    nof = [r for r in rows if not r.get("feasible")]
    if nof:
        lines.append(
            f"No feasible plan (any system) in {len(nof)} case(s): "
            + ", ".join(f"{r['algo']} {r['model']} x{r['gpus']}" for r in nof)
        )
    vno = [r for r in ok if r.get("verl_step_s") is None]
    if vno:
        lines.append(
            f"verl-style infeasible (out of memory) in {len(vno)} case(s) where RPEG fits: "
            + ", ".join(f"{r['algo']} {r['model']} x{r['gpus']}" for r in vno)
        )
    lines.append("")
    lines.append(
        "All numbers are predictions of RPEG's analytical performance model, not measurements."
    )
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    out = [
        "| algo | model | GPUs | RPEG s/step | vs verl | vs ReaL | vs AReaL | RPEG plan |",
        "|---|---|---|---|---|---|---|---|",
    ]
    f = lambda v: "n/a" if v is None else f"{v:.2f}x"  # noqa: E731
    for r in rows:
        if not r.get("feasible"):
            out.append(f"| {r['algo']} | {r['model']} | {r['gpus']} | infeasible | | | | |")
            continue
        out.append(
            f"| {r['algo']} | {r['model']} | {r['gpus']} | {r['rpeg_step_s']:.1f} | {f(r['speedup_verl'])} | "
            f"{f(r['speedup_real'])} | {f(r['speedup_areal'])} | {r['plan']} |"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="7B and 32B, 16 and 64 GPUs only")
    ap.add_argument("--json", help="write the rows as JSON")
    ap.add_argument("--md", help="write the tables as Markdown")
    args = ap.parse_args()
    models = ["qwen2.5-7b", "qwen2.5-32b"] if args.quick else MODELS
    gpus = [16, 64] if args.quick else GPUS
    rows = run(models, gpus, ALGOS)
    summary = summarize(rows)
    print()
    print(summary)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(table(rows) + "\n\n" + summary + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
