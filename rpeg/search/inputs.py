"""Turning what a user typed (a run config, flags, keyword arguments) into a RunConfig (pure)."""

from __future__ import annotations

from typing import Any

from rpeg import defaults
from rpeg.errors import ConfigError, Problem
from rpeg.ir.recipes import RECIPE_NAMES, canonical
from rpeg.search.problem import resolve_model

# Where a bare GPU name does not say which catalog cluster to use, prefer these.
PREFERRED_CLUSTER = {
    "gh200": "gh200-alps",
    "h100-sxm": "dgx-h100",
    "h200": "dgx-h200",
    "a100-80g": "dgx-a100",
    "gb200": "gb200-nvl72",
    "cpu": "local-cpu",
}
GPU_ALIASES = {"h100": "h100-sxm", "a100": "a100-80g"}

_ALGOS = RECIPE_NAMES  # rpeg.ir.recipes
# keywords that set the workload section of the run config under the same name
_WORKLOAD_KEYS = (
    "num_prompts",
    "samples_per_prompt",
    "max_response_tokens",
    "max_prompt_tokens",
    "mean_prompt_tokens",
    "mean_response_tokens",
    "precision",
    "train_minibatches",
)


def load_config(config: Any) -> Any:
    """A RunConfig from a RunConfig, a dict, or a YAML path/URL/text."""
    from rpeg.config import RunConfig

    if isinstance(config, RunConfig):
        return config
    if isinstance(config, dict):
        return RunConfig.from_dict(config)
    return RunConfig.from_yaml(config)


def cluster_for_gpu(gpu: str) -> str:
    """The catalog cluster for a GPU name (``gh200`` -> ``gh200-alps``)."""
    from rpeg import specs
    from rpeg.perf.validation.row_cells import GPU_COUNT, gpu_name

    if GPU_COUNT.match(gpu):
        raise ConfigError(
            [Problem("--gpu", f"{gpu!r}: name the GPU type here and the count in --gpus")]
        )
    table = specs.clusters()
    # as written, then as a published run's GPU cell reads (``H100 80GB``, ``A100-40GB``,
    # ``NVIDIA H100``: rpeg.perf.validation.row_cells.gpu_name)
    for name in (GPU_ALIASES.get(gpu.lower(), gpu.lower()), gpu_name({"gpu": gpu})):
        if name in PREFERRED_CLUSTER and PREFERRED_CLUSTER[name] in table:
            return PREFERRED_CLUSTER[name]
        for cname, cl in sorted(table.items()):
            if cl.gpu.name == name:
                return cname
    allowed = sorted({c.gpu.name for c in table.values()} | set(GPU_ALIASES))
    raise ConfigError([Problem("--gpu", f"unknown GPU {gpu!r}; allowed: {', '.join(allowed)}")])


def unknown_model_message(name: str) -> str:
    """A model the catalog lacks: the closest entries, how to add it, every entry."""
    import difflib

    from rpeg import specs
    from rpeg.perf.validation.model_words import catalog_key

    names = sorted(specs.models())
    close = difflib.get_close_matches(catalog_key(name), names, n=3, cutoff=0.6)
    hint = f" (closest: {', '.join(close)})" if close else ""
    return (
        f"unknown model {name!r}{hint}; add its architecture from its config.json with "
        f"`rpeg specs add-model --from-hf CONFIG.json`, or name one of: {', '.join(names)}"
    )


def config_from_kwargs(kw: dict[str, Any], *, base: Any = None) -> Any:
    """Apply flag-style keywords to ``base`` (or the defaults); None values are ignored."""
    from rpeg import specs
    from rpeg.config import RunConfig

    kw = {k: v for k, v in kw.items() if v is not None}
    cfg = base if base is not None else RunConfig()
    data = cfg.model_dump(mode="json")
    problems: list[Problem] = []
    known = {"model", "gpu", "cluster", "gpus", "algo", "max_staleness", "use_reference"}
    known |= set(_WORKLOAD_KEYS)
    for k in sorted(set(kw) - known):
        problems.append(Problem(k, f"unknown option; allowed: {', '.join(sorted(known))}"))
    if "model" in kw:
        try:
            data["model"]["name"] = resolve_model(kw["model"]).name
        except specs.SpecError:
            problems.append(Problem("--model", unknown_model_message(str(kw["model"]))))
    gpu_cluster = None
    if "gpu" in kw:
        try:
            gpu_cluster = cluster_for_gpu(str(kw["gpu"]))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if "cluster" in kw:
        if kw["cluster"] not in specs.clusters():
            problems.append(
                Problem(
                    "--cluster",
                    f"unknown cluster {kw['cluster']!r}; allowed: {', '.join(sorted(specs.clusters()))}",
                )
            )
        gpu_cluster = kw["cluster"]
    if "algo" in kw:
        a = canonical(str(kw["algo"])).replace("-", "_")
        if a not in _ALGOS:
            problems.append(
                Problem("--algo", f"unknown algorithm {kw['algo']!r}; allowed: {', '.join(_ALGOS)}")
            )
        data["algorithm"]["name"] = a
    if problems:
        raise ConfigError(problems)
    if gpu_cluster:
        data["cluster"]["name"] = gpu_cluster
        is_gpu = specs.clusters()[gpu_cluster].gpu.name != "cpu"
        if is_gpu and "precision" not in kw and base is None:
            data["workload"]["precision"] = "bf16"
        if is_gpu and base is None:
            w = data["workload"]
            w["max_prompt_tokens"] = kw.get("max_prompt_tokens", defaults.GPU_MAX_PROMPT_TOKENS)
            w["mean_prompt_tokens"] = kw.get("mean_prompt_tokens", defaults.GPU_MEAN_PROMPT_TOKENS)
    if "gpus" in kw:
        data["cluster"]["num_devices"] = int(kw["gpus"])
    for k in _WORKLOAD_KEYS:
        if k in kw:
            data["workload"][k] = kw[k]
    if "max_staleness" in kw:
        data["runtime"]["max_staleness"] = int(kw["max_staleness"])
    if "use_reference" in kw:
        data["algorithm"]["use_reference"] = bool(kw["use_reference"])
    return RunConfig.from_dict(data, source="plan options")
