"""How far a stand-in architecture prices a row from its own model (the spread behind
``rpeg.perf.interval.ARCH_FACTOR``).

    python benchmarks/bench_stand_in.py [--family]

Every step-time row of the shipped published-run sets is priced twice, in-sample, its layout
solved as ``rpeg validate`` solves it: with its own catalog model, and with the stand-in
(:func:`rpeg.perf.validation.stand_in.stand_in`) a name stating only its size would get from
a catalog holding no entry of the row's shape (same layers, width, heads, vocabulary, experts,
latent attention) nor one within 1% of its parameters -- what an unseen checkpoint of an
uncataloged family meets. ``--family`` keeps the model's family word in the name
(``qwen3-<size>``), else the name is bare (``mystery-<size>``). Prints each row's ratio
(stand-in / own) and a summary line: median, mean, 80th and 90th percentile of the ratio's
distance from 1 (the 80th and 90th as factors either way).
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import replace


def _shape(m):
    return (
        m.layers,
        m.hidden,
        m.ffn_hidden,
        m.heads,
        m.kv_heads,
        m.head_dim,
        m.vocab,
        m.moe,
        m.mla,
    )


def rows():
    from rpeg.perf.validation import loso
    from rpeg.perf.validation.published import read_rows

    for path in loso.default_datasets().values():
        for r in read_rows(path):
            if (r.get("measured_step_s") or "").strip():
                yield r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="store_true", help="keep the family word in the name")
    args = ap.parse_args()

    from rpeg import specs
    from rpeg.perf.calibration import SHIPPED
    from rpeg.perf.validation.row_cells import Unpredictable
    from rpeg.perf.validation.rows import read_case
    from rpeg.perf.validation.solve import solve_row
    from rpeg.perf.validation.stand_in import stand_in
    from rpeg.plan.schema import InfeasiblePlan

    catalog = specs.models()
    ratios: list[float] = []
    refused = 0
    for r in rows():
        try:
            case = read_case(r)
            _, _, own = solve_row(case, SHIPPED)
        except (Unpredictable, InfeasiblePlan, ValueError):
            continue  # not priced with its own model either
        m = case.model
        name = f"{m.name.split('-')[0]}-" if args.family else "mystery-"
        name += f"{m.params / 1e9:.1f}b"
        if m.moe is not None:
            name += f"-a{m.active_params / 1e9:.1f}b"
        if m.vision is not None:
            name += "-vl"
        others = {
            k: v
            for k, v in catalog.items()
            if _shape(v) != _shape(m) and abs(v.params / m.params - 1) > 0.01
        }
        spec = replace(stand_in(name, catalog=others), kind=m.kind)
        specs.add_run_model(spec)
        try:
            _, _, priced = solve_row(replace(case, model=spec), SHIPPED)
        except (InfeasiblePlan, ValueError) as exc:
            refused += 1
            print(f"{r['case_id']:44s} {m.name:30s} -> {spec.name:50s} refused: {exc}")
            continue
        q = priced.step_s / own.step_s
        ratios.append(q)
        print(f"{r['case_id']:44s} {m.name:30s} -> {spec.name:50s} {q:6.3f}")
    dist = sorted(abs(math.log(q)) for q in ratios)
    pct = lambda p: math.exp(dist[min(len(dist) - 1, int(p * len(dist)))])  # noqa: E731
    print(
        f"SUMMARY rows={len(ratios)} refused={refused} "
        f"median_off={statistics.median(abs(q - 1) for q in ratios):.3f} "
        f"mean_off={statistics.fmean(abs(q - 1) for q in ratios):.3f} "
        f"p80_factor={pct(0.8):.2f} p90_factor={pct(0.9):.2f}"
    )


if __name__ == "__main__":
    main()
