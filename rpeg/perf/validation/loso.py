"""Leave-one-source-out (LOSO) validation of the performance model with system factors.

A *source* is one publication, report or issue thread (the ``source`` column). Every fitted
quantity -- here the per-system factors of :mod:`rpeg.perf.systems` and the pooled factors
an unknown system falls back to -- is fitted without the source being scored, and the range
of each scored row comes from the LOSO residuals of comparable rows of *other* sources
(conformal-style), widened by the inputs the row leaves unknown. Nothing is fitted per source
or per model; the analytical constants (rpeg.perf.calibration) are shared by all rows.

Mechanics: each row is priced once per point of a grid of (gen_eff, train_eff) factors with
its layout solved at the shipped constants (here); the fit of the system parameters and the
length-prior multipliers is :mod:`rpeg.perf.validation.loso_fit`. Throughput-only rows are reported,
not fitted (their token counts rest on unpublished lengths).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rpeg.ir.graph import GraphError
from rpeg.perf.calibration import SHIPPED, Calibration
from rpeg.perf.interval import Unknowns, predict_interval
from rpeg.perf.pricing import predict_grid
from rpeg.perf.systems import UNKNOWN_WIDEN, normalise
from rpeg.perf.validation import mechanisms
from rpeg.perf.validation.loso_fit import GRID, fit, fit_lengths, interp_step, params  # noqa: F401
from rpeg.perf.validation.loso_lengths import LEN_GRID, at, multiplier, prior_kind, scaled
from rpeg.perf.validation.loso_oneshot import one_shot
from rpeg.perf.validation.loso_ranges import comparable_residuals, conformal_range, widened_bounds
from rpeg.perf.validation.loso_summary import Scored
from rpeg.perf.validation.row_cells import (
    Unpredictable,
    cell_float,
    measured_step,
    unknown_names,
)
from rpeg.perf.validation.row_text import canonical_system, system_of
from rpeg.perf.validation.rows import assumed_values, read_case
from rpeg.perf.validation.run_share import fitted_share, from_hours, outside_share
from rpeg.plan.schema import InfeasiblePlan
from rpeg.specs import SpecError

#: columns beyond the shared schema a data set may state (docs/perf-model.md); a row
#: without any of them is described as runs of the shared schema are
EXPLICIT = (
    "gpu_memory_utilization",
    "act_ckpt",
    "seq_packing",
    "streaming",
    "reuse_rollout_logprobs",
    "gen_cap",
    "system",
    "model_kind",
    "task_domain",
    "image_tokens",
    "spec_decode",
    "spec_draft_tokens",
    "spec_accept_len",
    "spec_topk",
    "spec_verify_tokens",
    "gen_max_seqs",
    "critic_gpus",
    "critic_nodes",
    "gen_batching",
    "gen_batch_size",
    "enforce_eager",
    "zero_stage",
    "cpu_adam",
    "reward_model",
)

#: the calibration whose interval carries only the row's unknown inputs
_UNKNOWN_ONLY = replace(
    SHIPPED,
    decode_uncertainty=0.0,
    compute_uncertainty=0.0,
    comm_uncertainty=0.0,
    fixed_cost_factor=1.0,
)


@dataclass
class Priced:
    """One row priced on the factor grid."""

    case_id: str
    source: str
    system: str
    dataset: str
    measured_s: float | None
    measured_tput: float | None
    # [length multiplier, gen, train] grid of predicted step seconds; the first axis has one
    # point when the row publishes its mean length (else LEN_GRID, rpeg.perf.validation.loso_lengths)
    step: np.ndarray
    tokens_per_step: np.ndarray  # per length multiplier
    stage_pred: dict[str, np.ndarray]  # at factors 1, per length multiplier: seconds
    stage_meas: dict[str, float]
    unknown_lo: float  # log width of the unknown-inputs-only interval, down / up
    unknown_hi: float
    unknown: tuple[str, ...] = ()
    solved: dict[str, Any] = field(default_factory=dict)  # blank layout fields -> chosen
    assumed: tuple[str, ...] = ()  # "column=value" of the priors it took (rows.assumed_values)
    # "explicit": the row states recipe columns beyond the shared schema; "shared": it does
    # not (as runs described only by the shared columns); its residuals calibrate rows of
    # the same regime
    regime: str = "explicit"
    # a copy of a row with its explicit columns blanked: calibrates ranges of shared-schema
    # rows, never fitted, never reported
    shadow: bool = False
    # the length prior the row takes ('reasoning'/'instruct'), '' when its mean is published
    kind: str = ""
    # its step is a run's hours / steps (rpeg.perf.validation.run_share); the run's measured share of
    # time outside its steps where it publishes its total and mean step times
    from_hours: bool = False
    run_share: float | None = None
    # what a calibrating row shares with another of its source (rpeg.perf.validation.loso_oneshot):
    # the row's model, GPU and mode (placement, on/off-policy) as written, and its system
    traits: tuple[str, ...] = ()
    # what the model reads of the row (:func:`inputs_of`)
    inputs: str = ""
    # what its prediction rests on (rpeg.perf.validation.mechanisms.of)
    mechanisms: tuple[str, ...] = ()

    def log_pred(self, lg: float, lt: float, lm: float = 0.0) -> float:
        return float(interp_step(at(self.step, lm), lg, lt))


def _stage_meas(r: dict[str, str]) -> dict[str, float]:
    out = {}
    kind = (r.get("measured_gen_kind") or "rollout").strip().lower()
    gen = cell_float(r, "measured_gen_s")
    if gen and kind == "rollout":
        out["generate"] = gen
    train = cell_float(r, "measured_train_s")
    if train:
        out["train_actor"] = train
    return out


def price_rows(
    rows: list[dict[str, str]], dataset: str, calib: Calibration = SHIPPED
) -> tuple[list[Priced], list[Scored]]:
    """Every row with a measurement priced on the grid; the rest as Scored with a reason."""
    from rpeg.perf.validation.published import published_throughput
    from rpeg.perf.validation.solve import solve_row

    priced, refused = [], []
    for r in rows:
        cid, src = r.get("case_id") or "?", r.get("source") or ""
        system = canonical_system(r.get("system") or "", r.get("train_backend") or "")
        system = system or normalise(system_of(r))
        try:
            step = measured_step(r)
            tput = published_throughput(r)
            if tput is not None and not tput > 0:
                raise Unpredictable(f"throughput {tput:g} tokens/s: must be positive")
        except Unpredictable as exc:
            refused.append(Scored(cid, src, system, dataset, None, f"unreadable: {exc}"))
            continue
        if step is None and tput is None:
            continue  # nothing measured: not a row of the check
        bad = unknown_names(r)
        try:
            if bad:
                raise Unpredictable(bad)
            case = read_case(r)
            case, lay, base = solve_row(case, calib)
            plan = case.plan(lay)
            kind = ""
            if "avg_gen_len" in case.unknown:
                kind = prior_kind(case.workload.response_kind or case.model.kind)
            mults = LEN_GRID if kind else (1.0,)
            grid = np.empty((len(mults), len(GRID), len(GRID)))
            tokens = np.empty(len(mults))
            stage_pred: dict[str, np.ndarray] = {
                k: np.empty(len(mults)) for k in ("generate", "train_actor")
            }
            for h, m in enumerate(mults):
                at_m = replace(
                    scaled(calib, m), gen_eff_scale=1.0, train_eff_scale=1.0, fwd_eff_scale=1.0
                )
                # the layout solved at the row's own lengths: a longer multiplier prices its
                # time, not whether the run (which happened) would fit (no memory check)
                pr, steps = predict_grid(case.graph, plan, case.workload, GRID, GRID, calib=at_m)
                grid[h] = steps
                tokens[h] = pr.tokens_per_step
                for k in stage_pred:
                    stage_pred[k][h] = _stage(pr, k)
            lo, hi = predict_interval(
                case.graph,
                plan,
                case.workload,
                _UNKNOWN_ONLY,
                Unknowns.of(case.unknown),
                point=base.step_s,
            )
            # the row's measured parts, read before it counts (a bad cell refuses the row)
            stage_meas, hours, run_share = _stage_meas(r), from_hours(r), outside_share(r, step)
        except (Unpredictable, InfeasiblePlan, SpecError, ValueError, GraphError) as exc:
            reason = " ".join(str(exc).split())
            if isinstance(exc, InfeasiblePlan):
                reason = "model says infeasible: " + reason
            refused.append(Scored(cid, src, system, dataset, step, reason))
            continue

        regime = "explicit" if any((r.get(c) or "").strip() for c in EXPLICIT) else "shared"
        priced.append(
            Priced(
                regime=regime,
                case_id=cid,
                source=src,
                system=system,
                dataset=dataset,
                measured_s=step,
                measured_tput=tput,
                step=grid,
                tokens_per_step=tokens,
                stage_pred=stage_pred,
                kind=kind,
                from_hours=hours,
                run_share=run_share,
                stage_meas=stage_meas,
                unknown_lo=math.log(base.step_s / max(lo, 1e-9)) if lo > 0 else 1.0,
                unknown_hi=math.log(hi / base.step_s),
                unknown=case.unknown,
                solved=dict(lay.solved),
                assumed=assumed_values(case, calib),
                traits=(*_traits(r), system),
                inputs=inputs_of(r),
                mechanisms=mechanisms.of(case, lay.solved),
            )
        )
    return priced, refused


#: columns that are not inputs of a row's prediction: its identity, what was measured, and the
#: free text (read only through the columns it states: rpeg.perf.validation.row_text)
NOT_INPUTS = (
    "case_id",
    "source_locator",
    "measured_by",
    "measured_step_s",
    "measured_gen_s",
    "measured_train_s",
    "measured_gen_kind",
    "measured_other",
    "inferred_fields",
    "notes",
    "model_arch_notes",
)


def inputs_of(r: dict[str, str]) -> str:
    """What the model reads of row ``r``, as one string: its cells with the columns its free
    text states filled in (rpeg.perf.validation.row_text.with_text), less :data:`NOT_INPUTS`,
    and whether its step is a run's hours over its steps (read from ``measured_other``)."""
    from rpeg.perf.validation.row_text import with_text

    cells = with_text(r)
    kept = sorted(
        (k, " ".join((v or "").lower().split()))
        for k, v in cells.items()
        if k not in NOT_INPUTS and (v or "").strip()
    )
    return repr((kept, from_hours(r)))


def _traits(r: dict[str, str]) -> tuple[str, ...]:
    """(model, gpu, mode) of a row as written, for the one-shot transfer."""
    cell = lambda c: " ".join((r.get(c) or "").lower().split())  # noqa: E731
    stale = cell("staleness") not in ("", "0")
    return cell("model"), cell("gpu"), f"{cell('placement')}/{'off' if stale else 'on'}"


def _stage(pred: Any, kind: str) -> float:
    return sum(s.time_s for s in pred.stages.values() if kind in s.kinds)


def score(priced: list[Priced]) -> list[Scored]:
    """In-sample and leave-one-source-out predictions and ranges for every priced row."""
    steps = [p for p in priced if p.measured_s]
    fitted = [p for p in steps if not p.shadow]
    sh_full = share_of(fitted)
    lm_full, full = fit_lengths(per_step(fitted, sh_full))
    out: dict[str, Scored] = {}
    resid_in: dict[str, float] = {}
    loso_f: dict[str, tuple[tuple[float, float], bool, float, float]] = {}
    for source in sorted({p.source for p in priced}):
        others = [p for p in fitted if p.source != source]
        sh = share_of(others)
        lm, fold = fit_lengths(per_step(others, sh))
        for p in priced:
            if p.source == source:
                loso_f[p.case_id] = (*params(fold, p.system), multiplier(lm, p.kind), sh)
    resid_loso: dict[str, float] = {}
    for p in priced:
        (g, t), _ = params(full, p.system)
        (lg, lt), known, lk, sh = loso_f[p.case_id]
        s = Scored(p.case_id, p.source, p.system, p.dataset, p.measured_s)
        run_in, run = (1 + sh_full, 1 + sh) if p.from_hours else (1.0, 1.0)
        s.pred_in = run_in * math.exp(p.log_pred(g, t, multiplier(lm_full, p.kind)))
        s.pred_loso = run * math.exp(p.log_pred(lg, lt, lk))
        s.system_fitted = known
        s.unknown, s.solved, s.assumed = p.unknown, p.solved, p.assumed
        s.inputs = p.inputs
        if p.measured_s:
            resid_in[p.case_id] = math.log(p.measured_s / s.pred_in)
            resid_loso[p.case_id] = math.log(p.measured_s / s.pred_loso)
        for st, m in p.stage_meas.items():
            pr = float(at(p.stage_pred[st], lk)) if st in p.stage_pred else 0.0
            if pr:
                f = lg if st == "generate" else lt
                s.stages[st] = (pr / math.exp(f), m)
        if p.measured_tput and not p.measured_s:
            s.tput = (float(at(p.tokens_per_step, lk)) / s.pred_loso, p.measured_tput)
        out[p.case_id] = s
    unchecked = mechanisms.unchecked(priced)
    for p in priced:
        if p.shadow:
            continue
        s = out[p.case_id]
        pool, own = comparable_residuals(resid_in, steps, p, None)
        s.lo_in, s.hi_in = widened_bounds(p, s.pred_in, *conformal_range(pool, 1.0))
        pool, own = comparable_residuals(resid_loso, steps, p, p.source)
        widen = 1.0 if (own and s.system_fitted) else UNKNOWN_WIDEN
        # what no other source's run checks widens the range (in-sample the row checks it)
        s.unchecked = unchecked[p.case_id]
        extra = mechanisms.extra_width(s.unchecked)
        s.lo_loso, s.hi_loso = widened_bounds(
            p, s.pred_loso, *conformal_range(pool, widen), extra=extra
        )
    rel = {
        k: (s.lo_loso / s.pred_loso, s.hi_loso / s.pred_loso)
        for k, s in out.items()
        if s.lo_loso is not None and s.pred_loso
    }
    folds = {k: (v[0][0], v[0][1], v[2], v[3]) for k, v in loso_f.items()}
    for cid, v in one_shot(steps, folds, rel).items():
        out[cid].one_shot = v
    return [out[p.case_id] for p in priced if not p.shadow]


def share_of(rows: list[Priced]) -> float:
    """The share of a run's time outside its steps, from ``rows`` (rpeg.perf.validation.run_share)."""
    return fitted_share([p.run_share for p in rows if p.run_share is not None])


def per_step(rows: list[Priced], share: float) -> list[Priced]:
    """``rows`` with an hours-derived step divided by ``1 + share`` (what the steps took)."""
    return [
        replace(p, measured_s=p.measured_s / (1 + share)) if p.from_hours and p.measured_s else p
        for p in rows
    ]


def default_datasets() -> dict[str, Path]:
    """The shipped data sets: label -> path."""
    from importlib import resources

    base = resources.files("rpeg.perf").joinpath("data")
    return {
        "steps_dev": Path(str(base.joinpath("published_runs.csv"))),
        "steps_dev2": Path(str(base.joinpath("published_runs2.csv"))),
    }


def shared_copies() -> dict[str, Path]:
    """The shipped data sets as ../shared/validation gives them (its columns only: the
    recipe columns beyond the shared schema left to the rows' free text): label -> path."""
    from importlib import resources

    base = resources.files("rpeg.perf").joinpath("data")
    return {
        "steps_dev (shared schema)": Path(str(base.joinpath("shared_steps_dev.csv"))),
        "steps_dev2 (shared schema)": Path(str(base.joinpath("shared_steps_dev2.csv"))),
    }


def run(paths: dict[str, Path] | None = None) -> tuple[list[Scored], list[Scored]]:
    """(scored, refused) over the data sets (default: both shipped ones), LOSO pooled. A
    row whose case id an earlier data set already holds is left out (the user's copy of a
    shipped file is scored once)."""
    from rpeg.perf.validation.published import read_rows

    priced, refused, seen = [], [], set()
    for label, path in (paths or default_datasets()).items():
        rows = [r for r in read_rows(path) if (r.get("case_id") or "?") not in seen]
        seen |= {r.get("case_id") or "?" for r in rows}
        p, r = price_rows(rows, label)
        priced += p
        refused += r
        priced += shadows(rows, label)
    return score(priced), refused


def shadows(rows: list[dict[str, str]], label: str) -> list[Priced]:
    """Copies of the rows that state explicit columns, with those columns blank: what the
    model predicts for them from the shared schema alone. Their LOSO residuals calibrate
    the ranges of rows that state no explicit column (a run described only by the shared
    columns is as uncertain as these copies), and nothing else."""
    blank = [
        {**r, **{c: "" for c in EXPLICIT}, "case_id": f"{r.get('case_id') or '?'}#shared"}
        for r in rows
        if any((r.get(c) or "").strip() for c in EXPLICIT)
    ]
    out = [replace(p, shadow=True, regime="shared") for p in price_rows(blank, label)[0]]
    return out
