"""What ``rpeg validate`` prints: per row, per data set, pooled, per source, per system and
per stage, in-sample and leave-one-source-out (rpeg.perf.validation.loso). Pure formatting."""

from __future__ import annotations

from typing import Any

from rpeg.perf.validation.loso_oneshot import summary as one_shot
from rpeg.perf.validation.loso_summary import Scored, Summary, by, stage_errors, summarise


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{x:.1f}%"  # nan-safe


def _summary_line(label: str, s: Summary) -> str:
    return (
        f"MAPE={_pct(s.mape)} max={_pct(s.max_ape)} coverage={_pct(100 * s.coverage)} "
        f"predicted={s.predicted}/{s.rows} ({_pct(100 * s.predicted_share)}) "
        f"median_width={_pct(100 * s.median_width)}  [{label}]"
    )


def lines(scored: list[Scored], refused: list[Scored], datasets: list[str]) -> list[str]:
    """The human-readable report of the rows of ``datasets`` (other data sets only joined
    the fit)."""
    scored = [s for s in scored if s.dataset in datasets]
    refused = [s for s in refused if s.dataset in datasets]
    out: list[str] = []
    allrows = scored + refused
    for ds in datasets:
        mine = [s for s in scored if s.dataset == ds]
        out.append(f"== {ds}: predicted leave-one-source-out (LOSO) and in-sample ==")
        out.append(
            f"{'case':44s} {'system':17s} {'measured':>9s} {'LOSO':>9s} {'range':>13s} "
            f"{'error':>7s} {'in-sample':>9s} {'error':>7s}"
        )
        for s in mine:
            if not s.measured_s:
                continue
            e_l = 100 * (s.pred_loso - s.measured_s) / s.measured_s  # type: ignore[operator]
            e_i = 100 * (s.pred_in - s.measured_s) / s.measured_s  # type: ignore[operator]
            inside = s.lo_loso <= s.measured_s <= s.hi_loso  # type: ignore[operator]
            rng = f"{s.lo_loso:.0f}-{s.hi_loso:.0f}"
            out.append(
                f"{s.case_id:44s} {(s.system or '-'):17s} {s.measured_s:9.1f} "
                f"{s.pred_loso:9.1f} {rng:>13s} {e_l:+6.1f}% {s.pred_in:9.1f} {e_i:+6.1f}%"
                + ("" if inside else " (outside range)")
                + ("" if s.system_fitted else " (system not in other sources: pooled prior)")
            )
            if s.solved:
                out.append(f"{'':46s}solved: " + ", ".join(f"{k}={v}" for k, v in s.solved.items()))
            if s.unchecked:
                out.append(
                    f"{'':46s}unchecked by other sources (range widened): " + ", ".join(s.unchecked)
                )
            assumed = s.assumed or [u for u in s.unknown if u != "gpu_memory_utilization"]
            if assumed:
                out.append(f"{'':46s}assumed (prior): " + ", ".join(assumed))
            for st, (p, m) in s.stages.items():
                out.append(f"{'':46s}{st}: {p:.1f} s vs {m:.1f} s ({100 * (p - m) / m:+.0f}%)")
        for s in refused:
            if s.dataset == ds:
                out.append(f"{s.case_id:44s} not predicted: {s.reason}")
    out += _throughput_lines(scored)
    out.append("== summary (step-time rows; coverage = share inside the printed range) ==")
    for ds in datasets:
        sub = [s for s in allrows if s.dataset == ds]
        out.append(f"{ds}:")
        out.append(
            "  in-sample  " + _summary_line("factors fitted on all sources", summarise(sub, False))
        )
        out.append("  LOSO       " + _summary_line("scored source left out", summarise(sub)))
        out.append("  one-shot   " + _one_shot_line(one_shot(sub)))
    if len(datasets) > 1:
        out.append("pooled:")
        out.append("  in-sample  " + _summary_line("all data sets", summarise(allrows, False)))
        out.append("  LOSO       " + _summary_line("all data sets", summarise(allrows)))
        out.append("  one-shot   " + _one_shot_line(one_shot(allrows)))
    out.append("by source (LOSO; one-shot: another row of the source calibrated the model):")
    for k, v in by(allrows, "source").items():
        if v.rows:
            o = one_shot([s for s in allrows if (s.source or "?") == k])
            out.append(
                f"  {k}: MAPE={_pct(v.mape)} max={_pct(v.max_ape)} "
                f"coverage={_pct(100 * v.coverage)} n={v.predicted}/{v.rows}"
                + (f"; one-shot MAPE={_pct(o['mape'])}" if o["rows"] else "")
            )
    out.append("by system (LOSO):")
    for k, v in by(allrows, "system").items():
        if v.rows:
            out.append(
                f"  {k}: MAPE={_pct(v.mape)} max={_pct(v.max_ape)} "
                f"coverage={_pct(100 * v.coverage)} n={v.predicted}/{v.rows}"
            )
    for st, (mape, mx, n) in stage_errors(scored).items():
        out.append(f"  stage {st}: MAPE={mape:.1f}% max={mx:.1f}% n={n} (LOSO)")
    pooled = summarise(allrows)
    o = one_shot(allrows)
    out.append(
        f"MAPE={_pct(pooled.mape)} max={_pct(pooled.max_ape)} n={pooled.predicted} "
        f"coverage={_pct(100 * pooled.coverage)} median_width={_pct(100 * pooled.median_width)} "
        f"predicted_share={_pct(100 * pooled.predicted_share)} (leave-one-source-out, "
        f"{' + '.join(datasets)}); one-shot MAPE={_pct(o['mape'])} n={o['rows']} "
        f"(uncalibrated {_pct(o['uncalibrated'])})"
    )
    return out


def _throughput_lines(scored: list[Scored]) -> list[str]:
    """Rows that publish only a throughput (no step time), summarised per source apart from
    the step-time figures they do not enter (docs/validation.md "Throughput-only rows")."""
    from statistics import median

    errors: dict[str, list[float]] = {}
    for s in scored:
        if s.tput:
            p, m = s.tput
            errors.setdefault(s.source or "?", []).append(100 * (p - m) / m)
    if not errors:
        return []
    out = [
        "== throughput-only rows: predicted vs published tokens/s, in no figure above "
        "(docs/validation.md 'Throughput-only rows'; each row: --json throughput_rows) =="
    ]
    for src, e in errors.items():
        out.append(
            f"  {src}: {len(e)} rows, median {median(e):+.0f}% "
            f"(from {min(e):+.0f}% to {max(e):+.0f}%)"
        )
    return out


def _one_shot_line(o: dict[str, float]) -> str:
    return (
        f"MAPE={_pct(o['mape'])} max={_pct(o['max_ape'])} coverage={_pct(100 * o['coverage'])} "
        f"rows={o['rows']} uncalibrated={_pct(o['uncalibrated'])} floor={_pct(o['floor'])}  "
        "[one row of the source calibrates, the others scored; uncalibrated: the same rows "
        "leave-one-source-out; floor: the least error any model has on rows that read the same]"
    )


def to_json(scored: list[Scored], refused: list[Scored], datasets: list[str]) -> dict[str, Any]:
    """The machine-readable report; ``loso`` / ``in_sample`` are the pooled figures of the
    rows of ``datasets``."""
    scored = [s for s in scored if s.dataset in datasets]
    refused = [s for s in refused if s.dataset in datasets]
    allrows = scored + refused
    pooled_loso, pooled_in = summarise(allrows), summarise(allrows, False)
    stages = stage_errors(scored)
    return {
        "loso": pooled_loso.as_dict(),
        "in_sample": pooled_in.as_dict(),
        "one_shot": one_shot(allrows),
        "datasets": {
            ds: {
                "loso": summarise([s for s in allrows if s.dataset == ds]).as_dict(),
                "one_shot": one_shot([s for s in allrows if s.dataset == ds]),
                "in_sample": summarise([s for s in allrows if s.dataset == ds], False).as_dict(),
            }
            for ds in datasets
        },
        "by_source": {
            k: {**v.as_dict(), "one_shot": one_shot([s for s in allrows if (s.source or "?") == k])}
            for k, v in by(allrows, "source").items()
            if v.rows
        },
        "by_system": {k: v.as_dict() for k, v in by(allrows, "system").items() if v.rows},
        "stage_errors": {k: {"mape": v[0], "max_ape": v[1], "n": v[2]} for k, v in stages.items()},
        # the pooled LOSO figures under the names earlier versions printed
        "mape": pooled_loso.mape,
        "max_ape": pooled_loso.max_ape,
        "coverage": pooled_loso.coverage,
        "median_width": pooled_loso.median_width,
        "rows": [
            {
                "case_id": s.case_id,
                "dataset": s.dataset,
                "source": s.source,
                "system": s.system,
                "measured_step_s": s.measured_s,
                "predicted_step_s": s.pred_in,
                "predicted_low_s": s.lo_in,
                "predicted_high_s": s.hi_in,
                "loso_step_s": s.pred_loso,
                "loso_low_s": s.lo_loso,
                "loso_high_s": s.hi_loso,
                "inside": s.lo_loso <= s.measured_s <= s.hi_loso,  # type: ignore[operator]
                "system_fitted": s.system_fitted,
                "unchecked": list(s.unchecked),
                "solved": s.solved,
                "unknown": list(s.unknown),
                "assumed": list(s.assumed),
                "stages": {
                    k: {"predicted_s": p, "measured_s": m} for k, (p, m) in s.stages.items()
                },
                # mean over the calibrating rows of its source (None: no other row)
                "one_shot_step_s": (
                    sum(p for p, _, _ in s.one_shot) / len(s.one_shot) if s.one_shot else None
                ),
            }
            for s in scored
            if s.measured_s
        ],
        "throughput_rows": [
            {
                "case_id": s.case_id,
                "source": s.source,
                "predicted_tokens_per_s": s.tput[0],
                "measured_tokens_per_s": s.tput[1],
            }
            for s in scored
            if s.tput
        ],
        "skipped": [{"case_id": s.case_id, "reason": s.reason} for s in refused],
    }
