"""Check the model against published step times (CSV in the schema of
shared/validation/steps_dev.csv): each row becomes a graph, a plan and a workload, is
predicted with the same ``predict`` a user calls, and is compared with ``measured_step_s``.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpeg.errors import Problem
from rpeg.ir.graph import GraphError
from rpeg.perf.calibration import DEFAULT, Calibration
from rpeg.perf.pricing import StepPrediction, Workload, predict
from rpeg.plan.schema import GraphRef, InfeasiblePlan, Plan, UnitPlan
from rpeg.specs import SpecError

# Prompt length assumed where a row does not publish it (DAPO-Math-17k prompts with the
# verl template are ~100-200 tokens).
DEFAULT_PROMPT_TOKENS = 150.0


# Rows the model cannot match honestly with one set of constants, and why (docs/perf-model.md,
# "Rows that cannot be matched"). They stay in every all-rows figure; ``Report.excluding``
# gives the figure without them so that both can be reported.
INCONSISTENT_ROWS: dict[str, str] = {
    "verl-fa-7b-async-16-16": (
        "trainer on 16 GPUs: 16 x 269.8 = 4,317 GPU-s per step vs 32 x 313.8 = 10,042 for the "
        "same recipe colocated (verl fully_async.md); the doc attributes such differences to "
        "response lengths, which are unpublished, so no single length fits both"
    ),
    "verl-fa-7b-async-32-32": (
        "as verl-fa-7b-async-16-16 (32 x 157.0 = 5,023 GPU-s per step vs 8,538-10,042 colocated)"
    ),
}


class Unpredictable(Exception):
    """A row the model cannot price honestly; the message says why."""


def _one_line(exc: Exception) -> str:
    """A validation error's messages on one line (pydantic prints one per line)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            return "; ".join(str(e.get("msg", e)) for e in errors())
        except Exception:  # noqa: BLE001 - fall back to the text
            pass
    return " ".join(str(exc).split())


@dataclass
class RowResult:
    case_id: str
    source: str
    measured_step_s: float | None
    predicted_step_s: float | None = None
    reason: str = ""
    prediction: StepPrediction | None = None
    measured_throughput: float | None = None  # whole-cluster tokens/s where published

    @property
    def error(self) -> float | None:
        if self.predicted_step_s is None or not self.measured_step_s:
            return None
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s


@dataclass
class Report:
    rows: list[RowResult] = field(default_factory=list)

    @property
    def compared(self) -> list[RowResult]:
        return [r for r in self.rows if r.error is not None]

    @property
    def skipped(self) -> list[RowResult]:
        return [r for r in self.rows if r.error is None]

    @property
    def mape(self) -> float:
        c = self.compared
        return 100.0 * sum(abs(r.error) for r in c) / len(c) if c else float("nan")

    @property
    def max_ape(self) -> float:
        c = self.compared
        return 100.0 * max(abs(r.error) for r in c) if c else float("nan")

    def excluding(self, case_ids: Any = None) -> Report:
        """The same report without ``case_ids`` (default: the documented INCONSISTENT_ROWS)."""
        drop = set(INCONSISTENT_ROWS if case_ids is None else case_ids)
        return Report([r for r in self.rows if r.case_id not in drop])

    def by_source(self) -> dict[str, tuple[float, int]]:
        """source family -> (MAPE %, rows) over the step-time rows."""
        return {k: (v[0], v[2]) for k, v in self.by_source_max().items()}

    def by_source_max(self) -> dict[str, tuple[float, float, int]]:
        """source family -> (MAPE %, max abs error %, rows) over the step-time rows."""
        return _by_family((source_family(r.source), abs(r.error)) for r in self.compared)

    def throughput_by_source(self) -> dict[str, tuple[float, float, int]]:
        """source family -> (mean abs error %, max abs error %, rows) over the
        throughput-only rows (compared as whole-cluster tokens/s)."""
        fam = {r.case_id: source_family(r.source) for r in self.rows}
        return _by_family((fam[c], abs(p - m) / m) for c, p, m in self.throughput_rows())

    @property
    def not_predicted(self) -> list[RowResult]:
        """Rows with neither a step-time nor a throughput comparison, each with its reason."""
        return [r for r in self.skipped if not (r.measured_throughput and r.prediction)]

    def throughput_rows(self) -> list[tuple[str, float, float]]:
        """(case, predicted, measured) whole-cluster tokens/s for throughput-only rows."""
        out = []
        for r in self.rows:
            if r.measured_throughput and r.prediction and r.measured_step_s is None:
                p = r.prediction
                out.append((r.case_id, p.tokens_per_step / p.step_s, r.measured_throughput))
        return out


def _by_family(errors: Any) -> dict[str, tuple[float, float, int]]:
    """(family, abs relative error) pairs -> family -> (mean %, max %, count)."""
    out: dict[str, list[float]] = {}
    for fam, err in errors:
        out.setdefault(fam, []).append(err)
    return {k: (100.0 * sum(v) / len(v), 100.0 * max(v), len(v)) for k, v in out.items()}


def source_family(source: str) -> str:
    s = source.lower()
    if "nemo" in s:
        return "NeMo-RL"
    if "verl" in s:
        return "verl"
    if "areal" in s:
        return "AReaL"
    return source.split()[0] if source else "?"


def read_rows(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# The catalog cluster a row's GPU runs in by default; a row whose `gpus_per_node` differs
# is priced on a catalog cluster of that GPU with that node size (see ``_cluster_for``).
_CLUSTER_FOR_GPU = {
    "h100-sxm": "dgx-h100",
    "h200": "dgx-h200",
    "h800": "h800-cluster",
    "h20": "h20-cluster",
    "gb200": "gb200-nvl72",
    "gh200": "gh200-alps",
    "gh200-144g": "gh200-144g-quad",
    "a100-80g": "dgx-a100",
    "mi300x": "mi300x-cluster",
    "cpu": "local-cpu",
}


def _cluster_for(gpu: str, gpus_per_node: int | None) -> str:
    """Catalog cluster of ``gpu`` with ``gpus_per_node`` GPUs per node (the default cluster
    when the row does not say); Unpredictable naming what is missing otherwise."""
    from rpeg import specs

    default = _CLUSTER_FOR_GPU.get(gpu)
    candidates = [n for n, c in sorted(specs.clusters().items()) if c.gpu.name == gpu]
    if default in candidates:
        candidates.remove(default)
        candidates.insert(0, default)
    if not candidates:
        raise Unpredictable(f"no catalog cluster of {gpu} GPUs (add one to clusters.yaml)")
    if gpus_per_node is None:
        return candidates[0]
    for name in candidates:
        if specs.cluster(name).gpus_per_node == gpus_per_node:
            return name
    sizes = sorted({specs.cluster(n).gpus_per_node for n in candidates})
    raise Unpredictable(
        f"gpus_per_node={gpus_per_node}: catalog clusters of {gpu} have {sizes} GPUs per node "
        "(add one to clusters.yaml)"
    )


def check_names(rows: list[dict[str, str]]) -> None:
    """Unknown models or GPUs anywhere in the file: one error naming all of them."""
    from rpeg import specs

    problems = []
    models, gpus = specs.models(), specs.gpus()
    for i, r in enumerate(rows, start=2):
        cid = r.get("case_id") or f"line {i}"
        if r.get("model") and r["model"] not in models:
            problems.append(Problem(f"{cid}.model", f"unknown model {r['model']!r}"))
        if r.get("gpu") and r["gpu"] not in gpus:
            problems.append(Problem(f"{cid}.gpu", f"unknown GPU {r['gpu']!r}"))
    if problems:
        raise SpecError(problems, title="unknown names in validation CSV")


_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")


def _number(r: dict[str, str], k: str) -> float | None:
    """The leading number of column ``k`` ("8", "8.0", "8 (inferred)"); None when blank.
    Anything else is a row the model cannot read, reported with the column and value."""
    v = (r.get(k) or "").strip()
    if not v:
        return None
    m = _NUMBER.match(v)
    if m is None:
        raise Unpredictable(f"{k}={v!r} is not a number")
    return float(m.group(1))


def _int(r: dict[str, str], k: str, default: int | None = None, minimum: int = 1) -> int:
    v = _number(r, k)
    if v is None:
        if default is None:
            raise Unpredictable(f"{k} not published")
        return default
    if v < minimum:
        raise Unpredictable(f"{k}={v:g}: must be >= {minimum}")
    return int(v)


def _float(r: dict[str, str], k: str) -> float | None:
    v = _number(r, k)
    return None if v is None or v <= 0 else v


def _yes(r: dict[str, str], k: str) -> bool:
    return (r.get(k) or "").strip().lower() in ("yes", "true", "1", "y")


def _note(notes: str, key: str) -> str | None:
    m = re.search(rf"{re.escape(key)}\s*=\s*([\w.]+)", notes)
    return m.group(1) if m else None


def row_case(r: dict[str, str]) -> tuple[Any, Plan, Workload]:
    """The (graph, plan, workload) a CSV row describes."""
    from rpeg import specs
    from rpeg.ir import builders

    model = specs.model(r["model"])
    if model.unsupported:
        raise Unpredictable(f"model {model.name}: {model.unsupported}")
    notes = r.get("notes", "")
    n = _int(r, "num_gpus")
    placement = (r.get("placement") or "").strip().lower()
    if placement not in ("colocated", "disaggregated"):
        raise Unpredictable(f"placement={placement!r}; allowed: colocated, disaggregated")
    colocated = placement == "colocated"
    # colocated rows often leave the pool sizes blank: both roles use every GPU
    gen_n = _int(r, "gen_gpus", n if colocated else None)
    train_n = _int(r, "train_gpus", n if colocated else None)
    st = (r.get("staleness") or "0").strip().lower()
    staleness = (
        10**6 if st in ("inf", "infinite", "unbounded") else _int(r, "staleness", 0, minimum=0)
    )
    partial = _yes(r, "partial_rollout")
    has_ref = _yes(r, "has_ref")
    # PPO with a learned critic: a value forward and a critic update on the trainer pool
    # (the critic is the actor's architecture, as in verl/OpenRLHF recipes by default).
    # A blank has_critic follows the algorithm: plain "ppo" / GAE has a critic.
    critic_cell = (r.get("has_critic") or "").strip()
    algo = (r.get("algorithm") or "").strip().lower()
    has_critic = _yes(r, "has_critic") if critic_cell else algo in ("ppo", "ppo-gae", "gae")
    builder = "ppo" if has_critic else "grpo"
    graph = builders.build(builder, use_reference=has_ref, staleness=min(staleness, 1000))
    gen_devs = f"0-{n - 1}" if colocated else f"0-{gen_n - 1}"
    train_devs = f"0-{n - 1}" if colocated else f"{gen_n}-{gen_n + train_n - 1}"
    if not colocated and gen_n + train_n != n:
        raise Unpredictable(f"gen_gpus + train_gpus = {gen_n + train_n} != num_gpus = {n}")
    util = _note(notes, "vllm_gpu_mem_util") or _note(notes, "gpu_memory_utilization") or "0.8"
    backend = (r.get("train_backend") or "").lower()
    # ZeRO-3 (DeepSpeed, OpenRLHF) shards parameters like FSDP; everything else (Megatron,
    # ReaL/AReaL 3D) keeps replicated TP/PP shards
    engine = "fsdp" if any(k in backend for k in ("fsdp", "deepspeed", "zero")) else "megatron"
    recompute = _note(notes, "act_ckpt") != "False"
    packing = _note(notes, "seq_packing") != "False"
    tp, pp, cp, ep = (
        _int(r, "train_tp", 1),
        _int(r, "train_pp", 1),
        _int(r, "train_cp", 1),
        _int(r, "train_ep", 1),
    )
    try:
        gen = UnitPlan(
            devices=gen_devs,
            tp=_int(r, "gen_tp", 1),
            pp=_int(r, "gen_pp", 1),
            gpu_memory_utilization=float(util),
            offload=colocated,
            engine="vllm",
        )
        train = UnitPlan(
            devices=train_devs,
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            engine=engine,
            recompute=recompute,
            seq_packing=packing,
            offload=colocated,
        )
    except ValueError as exc:
        raise Unpredictable(f"layout: {_one_line(exc)}") from None
    units = {}
    for name, members in _units(graph):
        units[name] = gen if members & {"generate", "reward"} else train
    reuse = "old_log_prob not recomputed" in notes or "use_rollout_log_probs=True" in notes
    streaming = (not colocated) and staleness == 0 and "stream" in notes
    gpn = _number(r, "gpus_per_node")
    cluster_name = _cluster_for(r["gpu"], int(gpn) if gpn else None)
    cl = specs.cluster(cluster_name)
    plan = Plan(
        cluster=cluster_name,
        num_nodes=max(1, -(-n // cl.gpus_per_node)),
        model=model.name,
        graph=GraphRef(
            builder=builder,
            options={
                "use_reference": has_ref,
                "staleness": staleness,
                "reuse_rollout_logprobs": reuse,
            },
        ),
        staleness=min(staleness, 10**6),
        partial_rollout=partial and staleness >= 1,
        streaming=streaming,
        units=units,
    )
    prompt = _float(r, "avg_prompt_len") or DEFAULT_PROMPT_TOKENS
    cap = _int(r, "max_gen_len")
    max_seq = _float(r, "max_seq_len")
    if max_seq and "effective gen cap" in notes:
        cap = int(min(cap, max_seq - prompt))
        if cap < 1:
            raise Unpredictable(f"max_seq_len={max_seq:g} leaves no room for a response")
    prec = ((r.get("precision") or "bf16").split() or ["bf16"])[0].lower()
    if prec not in ("bf16", "fp16", "fp8", "fp32"):
        raise Unpredictable(f"precision={prec!r}; allowed: bf16, fp16, fp8, fp32")
    wl = Workload(
        num_prompts=_int(r, "num_prompts"),
        samples_per_prompt=_int(r, "samples_per_prompt"),
        mean_prompt_tokens=prompt,
        max_response_tokens=cap,
        mean_response_tokens=_float(r, "avg_gen_len"),
        train_minibatches=_int(r, "train_minibatches", 1),
        precision=prec,
        max_seq_tokens=int(max_seq) if max_seq else None,
    )
    return graph, plan, wl


def _units(graph: Any) -> list[tuple[str, set[str]]]:
    from rpeg.perf.pricing import graph_units

    return [(n, {k for _, k, _ in members}) for n, members in graph_units(graph)]


def _throughput(r: dict[str, str]) -> float | None:
    """Whole-cluster tokens/s where the row publishes a throughput: AReaL's effective
    training throughput, or NeMo-RL/verl tokens/s/GPU x the row's GPUs."""
    other = r.get("measured_other", "") or ""
    m = re.search(r"effective_train_throughput_tok_s\s*=\s*([\d.]+)", other)
    if m:
        return float(m.group(1))
    m = re.search(r"tokens_per_s_per_gpu\s*=\s*([\d.]+)", other)
    n = _number(r, "num_gpus")
    if m and n:
        return float(m.group(1)) * n
    return None


def validate_rows(rows: list[dict[str, str]], calib: Calibration = DEFAULT) -> Report:
    check_names(rows)
    rep = Report()
    for r in rows:
        res = RowResult(
            case_id=r.get("case_id") or "?", source=r.get("source") or "", measured_step_s=None
        )
        rep.rows.append(res)
        try:
            step = _number(r, "measured_step_s")
            if step is not None and step <= 0:
                raise Unpredictable(f"measured_step_s={step:g} must be > 0")
            res.measured_step_s = step
            res.measured_throughput = _throughput(r)
        except Unpredictable as exc:
            res.reason = f"measurement unreadable: {exc}"
            continue
        if res.measured_step_s is None and res.measured_throughput is None:
            res.reason = "no measured_step_s"
            continue
        try:
            graph, plan, wl = row_case(r)
            pred = predict(graph, plan, wl, calib=calib)
        except Unpredictable as exc:
            res.reason = str(exc)
            continue
        except (ValueError, GraphError) as exc:  # a config the plan/graph validators refuse
            res.reason = "row describes an invalid plan: " + _one_line(exc)
            continue
        except InfeasiblePlan as exc:
            res.reason = f"model says infeasible: {exc}"
            continue
        except SpecError as exc:
            res.reason = str(exc).replace("\n", " ")
            continue
        res.prediction = pred
        res.predicted_step_s = pred.step_s
        if res.measured_step_s is None:
            res.reason = "throughput-only row (no step time): compared as tokens/s"
    return rep


def validate_csv(path: str | Path, calib: Calibration = DEFAULT) -> Report:
    return validate_rows(read_rows(path), calib)
