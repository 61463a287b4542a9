"""``rpeg eval``: a model's accuracy and pass@k on a data file, per data source.

What is evaluated (:func:`resolve_model`): a run folder (``<output_dir>/<run_id>/`` holding the
run's resolved ``config.yaml``: its newest checkpoint, found in the folder or at the run's
``runtime.checkpoint_url``), an rpeg checkpoint (a step folder, a run's checkpoint folder, or
a checkpoint URL holding one run: written to a temporary Hugging Face folder by
:func:`rpeg.runtime.export.export_checkpoint`, as ``rpeg export`` does), or a Hugging Face
model folder (``config.json``).

How (:func:`evaluate_model`): the data file is read as training reads it (any kind:
JSONL, Parquet, a ``datasets`` folder; the config's ``task.prompt_key`` / ``answer_key`` /
chat template / system prompt), every prompt rendered with the model's tokenizer and
answered ``samples`` times (greedy for 1, else at ``workload.temperature``), scored by the
task's rewards routed by data source (``task.reward_by_source``). The metrics are
:mod:`rpeg.runtime.validation`'s: ``val/accuracy`` (the mean over samples), ``val/pass@k``
(a prompt counts when any of its k samples is correct), the same per source. Nothing read
is executed: checkpoints through the export's safe reader, data with pyarrow and json."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpeg.errors import ConfigError, Problem

RUN_CONFIG = "config.yaml"  # a run folder's resolved config (rpeg train writes it)


@dataclass
class ModelSource:
    """What ``rpeg eval`` evaluates: an HF folder to load, or a checkpoint to export first;
    ``config``: the run's config when the source came with one (a run folder)."""

    kind: str  # "hf" | "checkpoint"
    url: str
    config: Any = None
    described: str = ""


def _is_hf_folder(path: str) -> bool:
    return (Path(path) / "config.json").is_file()


def _run_checkpoint(folder: str, config: Any) -> str | None:
    """The checkpoint location of a run folder: the folder itself, or its run's place at
    ``runtime.checkpoint_url`` (``<url>/<run_id>``: never another run's checkpoints; the URL
    alone only for a config without a run id)."""
    from rpeg.runtime.actors.checkpoint import find_checkpoint

    rt = config.runtime
    places = [folder]
    if rt.checkpoint_url:
        if rt.run_id:
            places.append(f"{rt.checkpoint_url.rstrip('/')}/{rt.run_id}")
        else:
            places.append(rt.checkpoint_url)
    for url in places:
        try:
            if find_checkpoint(url) is not None:
                return url
        except Exception:  # noqa: BLE001 - a place that is not a checkpoint: try the next
            continue
    return None


def resolve_model(source: str, config_path: str | None = None) -> ModelSource:
    """See the module doc; ConfigError (exit 2) naming what ``source`` was found to be."""
    from rpeg.config import RunConfig

    def load_config(path: str) -> RunConfig:
        return RunConfig.from_yaml(path)

    run_cfg = Path(source) / RUN_CONFIG
    if run_cfg.is_file():  # a run folder
        cfg = load_config(str(run_cfg))
        ckpt = _run_checkpoint(source, cfg)
        if ckpt is None:
            raise ConfigError(
                [
                    Problem(
                        "SOURCE",
                        f"the run folder {source} has no checkpoint (in the folder or at its "
                        f"runtime.checkpoint_url={cfg.runtime.checkpoint_url!r}); evaluate a "
                        "checkpoint or an exported HF folder instead",
                    )
                ]
            )
        return ModelSource("checkpoint", ckpt, cfg, f"run {source} (checkpoint {ckpt})")
    cfg = load_config(config_path) if config_path else None
    if _is_hf_folder(source):
        return ModelSource("hf", source, cfg, f"model folder {source}")
    from rpeg.runtime.actors.checkpoint import find_checkpoint

    try:
        found = find_checkpoint(source)
    except Exception as exc:  # noqa: BLE001 - several runs, unreadable: said below
        found, why = None, f" ({exc})"
    else:
        why = ""
    if found is not None:
        return ModelSource("checkpoint", source, cfg, f"checkpoint {source}")
    raise ConfigError(
        [
            Problem(
                "SOURCE",
                f"{source!r} is neither a run folder (with {RUN_CONFIG}), nor an rpeg "
                f"checkpoint (a step folder, a run's checkpoint folder), nor a Hugging Face "
                f"model folder (config.json){why}",
            )
        ]
    )


def eval_config(src: ModelSource, data: str, overrides: dict[str, Any]) -> Any:
    """The run config the evaluation reads: the source's (or the defaults), ``task.url`` the
    data file (its kind by suffix: rpeg.runtime.task_data.val_kind), then ``overrides``."""
    from rpeg.config import RunConfig
    from rpeg.runtime.task_data import val_kind

    base = src.config if src.config is not None else RunConfig()
    probe = base.task.model_copy(update={"val_url": data})
    kind = val_kind(probe)
    task = {"task.url": data, "task.kind": kind, "task.val_url": None}
    return base.with_overrides({**task, **overrides})


def evaluate_model(
    source: str,
    data: str,
    *,
    samples: int = 1,
    config_path: str | None = None,
    model_path: str | None = None,
    overrides: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``{"model", "data", "samples", "prompts", "metrics"}`` of ``source`` on ``data``
    (see the module doc). ``model_path``: the model folder a checkpoint was trained from
    (default: the config's ``model.path``; none for the built-in tiny model)."""
    if samples < 1:
        raise ConfigError([Problem("--samples", f"must be >= 1 (got {samples})")])
    say = log or (lambda s: None)
    src = resolve_model(source, config_path)
    cfg = eval_config(src, data, dict(overrides or {}))
    from rpeg.runtime.datasets.files import check_examples

    problems = check_examples(cfg.task.url, cfg.task.kind, keys=_keys(cfg), where="--data")
    if problems:
        raise ConfigError(problems, title=f"invalid data file {data}")
    with tempfile.TemporaryDirectory(prefix="rpeg-eval-") as tmp:
        folder = src.url
        if src.kind == "checkpoint":
            from rpeg.runtime.export import export_checkpoint

            folder = str(Path(tmp) / "hf")
            where = export_checkpoint(
                src.url, folder, model_path=model_path or cfg.model.path, config=cfg
            )
            say(f"eval: {where} loaded")
        fixed = "workload.max_prompt_tokens" in (overrides or {})
        metrics = _evaluate_folder(folder, cfg, samples, fit_prompts=not fixed, log=say)
    return {
        "model": src.described,
        "data": data,
        "samples": samples,
        "prompts": int(metrics.get("val/prompts", 0)),
        "metrics": metrics,
    }


def _keys(cfg: Any) -> Any:
    from rpeg.runtime.datasets.files import RowKeys

    return RowKeys.from_task(cfg.task)


def _evaluate_folder(
    folder: str,
    cfg: Any,
    samples: int,
    fit_prompts: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """The validation metrics of the model in ``folder``; ``fit_prompts``: the prompt
    length limit is the data's longest prompt (else the config's, per ``task.overlong``)."""
    import torch

    from rpeg.runtime.data import load_examples
    from rpeg.runtime.datasets.prompts import prompt_format, render_examples
    from rpeg.runtime.model_io import load_model_and_tokenizer
    from rpeg.runtime.rewards import RewardSet
    from rpeg.runtime.roles import PolicyWorker
    from rpeg.runtime.validation import validation_metrics

    torch.manual_seed(cfg.runtime.seed)
    model, tok = load_model_and_tokenizer(folder, cfg.model.dtype, where="SOURCE")
    model.eval()
    t = cfg.task
    examples = load_examples(t.url, t.kind, _keys(cfg), "--data")
    limit = None if fit_prompts else cfg.workload.max_prompt_tokens
    examples, report = render_examples(
        examples,
        tok,
        prompt_format(t, tok),
        max_prompt_tokens=limit,
        overlong=t.overlong,
        where="--data",
    )
    if fit_prompts:
        cfg = cfg.with_overrides({"workload.max_prompt_tokens": report.longest})
    if log is not None:  # before the generation, the long part
        how = "greedy" if samples == 1 else f"{samples} samples each"
        log(f"eval: answering {len(examples)} prompts ({how}), longest {report.longest} tokens")
    rewards = RewardSet.from_task(t)
    rewards.use_sources([e.data_source for e in examples])
    actor = PolicyWorker(model, tok, workload=cfg.workload, trainable=False, seed=cfg.runtime.seed)
    with torch.no_grad():
        return validation_metrics(
            actor, tok, examples, rewards, t.prompt_template, samples=samples, seed=cfg.runtime.seed
        )


def report_lines(result: dict[str, Any]) -> list[str]:
    """The console table: one row for all prompts, one per data source."""
    from rpeg.runtime.validation import PREFIX, sources_of

    m, k = result["metrics"], result["samples"]
    how = "greedy" if k == 1 else f"{k} samples per prompt"
    lines = [f"{result['model']} on {result['data']}: {result['prompts']} prompts, {how}"]
    head = f"  {'data source':<36} {'accuracy':>9}" + (f" {'pass@' + str(k):>9}" if k > 1 else "")
    lines.append(head)

    def row(name: str, pre: str) -> str:
        out = f"  {name:<36} {m[pre + 'accuracy']:>9.3f}"
        return out + (f" {m[pre + f'pass@{k}']:>9.3f}" if k > 1 else "")

    if not m:
        return [*lines, "  (no prompts)"]
    lines.append(row("all", PREFIX))
    lines += [row(s, f"{PREFIX}{s}/") for s in sources_of(m)]
    return lines
