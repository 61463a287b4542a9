"""What a run reads, checked before it starts: the model (catalog name, built-in tiny model,
model folders), the generation engine, the algorithm (a group baseline needs 2 samples per
prompt) and the task (rewards registered, the data file's rows, the prompt template)."""

from __future__ import annotations

from rpeg.config import RunConfig
from rpeg.errors import Problem
from rpeg.ir.recipes import RECIPES

#: the built-in model (trained when ``model.path`` is None)
TINY_MODEL = "rpeg-tiny"


def check_generation_engine(config: RunConfig) -> list[Problem]:
    """``runtime.engine: vllm`` needs vLLM in this Python (on a CPU machine: the environment
    ``bash scripts/vllm_env.sh DIR`` builds); an untested vLLM release is a warning naming
    both versions (rpeg.runtime.engines.choice)."""
    if config.runtime.engine != "vllm":
        return []
    import sys
    import warnings

    from rpeg.runtime.engines.choice import VLLM_INSTALL, vllm_importable, vllm_version_warning

    if not vllm_importable():
        return [
            Problem(
                "runtime.engine",
                f"vllm is not installed in this Python ({sys.executable}): {VLLM_INSTALL} "
                "builds a virtual environment with vLLM's CPU build and the project (run "
                "DIR/bin/rpeg there); on CUDA machines pip install 'rpeg[gpu]'; or use "
                "runtime.engine: torch",
            )
        ]
    msg = vllm_version_warning()
    if msg:
        warnings.warn(msg, stacklevel=2)
    return []


# ------------------------------------------------------------------------------ model
def check_model(config: RunConfig) -> list[Problem]:
    from rpeg import specs

    m = config.model
    out: list[Problem] = []
    names = sorted(specs.models())
    if m.name not in names:
        from rpeg.search.inputs import unknown_model_message

        out.append(Problem("model.name", unknown_model_message(m.name)))
    elif m.path is None and m.name != TINY_MODEL:
        out.append(
            Problem(
                "model.name",
                f"{m.name!r} has no weights here: set model.path to its Hugging Face folder "
                f"(without model.path the built-in {TINY_MODEL!r} is trained)",
            )
        )
    for field in ("path", "critic_path", "reward_model_path"):
        url = getattr(m, field)
        if url:
            out += _check_model_folder(url, f"model.{field}")
    return out


def _check_model_folder(url: str, where: str) -> list[Problem]:
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url)
        if not fs.exists(root):
            return [Problem(where, f"{url!r} does not exist")]
        if not fs.isdir(root):
            return [Problem(where, f"{url!r} is not a folder (a Hugging Face model folder)")]
        if not fs.exists(f"{root.rstrip('/')}/config.json"):
            return [Problem(where, f"{url!r} holds no config.json (not a Hugging Face model)")]
    except Exception as exc:  # noqa: BLE001 - any failure to look is a problem to report
        return [Problem(where, f"{url!r} cannot be read: {type(exc).__name__}: {exc}")]
    return []


# ------------------------------------------------------------------------------ algorithm
#: algorithms whose advantage compares a sample with the other samples of its prompt
GROUP_BASELINES = tuple(n for n, r in RECIPES.items() if r.group_baseline)


def check_algorithm(config: RunConfig) -> list[Problem]:
    """A group baseline needs a group: GRPO's advantage with one sample per prompt is 0 for
    every sample (the run would train on its KL and entropy terms alone), RLOO's has no
    other sample to leave out (verl refuses GRPO with ``rollout.n`` = 1 likewise)."""
    a, k = config.algorithm.name, config.workload.samples_per_prompt
    if a in GROUP_BASELINES and k < 2:
        return [
            Problem(
                "workload.samples_per_prompt",
                f"{a} needs at least 2 samples per prompt (got {k}): its advantage compares "
                "each sample with the other samples of its prompt; or use algorithm.name "
                "reinforce_pp or ppo, which need no group",
            )
        ]
    return []


# ------------------------------------------------------------------------------ task
def check_task(config: RunConfig) -> list[Problem]:
    from rpeg.runtime.data import check_template
    from rpeg.runtime.datasets.files import check_examples
    from rpeg.runtime.rewards import (
        REWARD_IMPORT_TIMEOUT_S,
        load_reward_modules,
        registered_rewards,
    )

    t = config.task
    # their rewards register now; each import tried first in a child stopped at the timeout
    out: list[Problem] = load_reward_modules(t.reward_modules, REWARD_IMPORT_TIMEOUT_S)
    known = registered_rewards()
    for i, name in enumerate(t.rewards):
        if name not in known:
            out.append(
                Problem(f"task.rewards[{i}]", f"unknown reward {name!r}; registered: {known}")
            )
    if not t.rewards:
        out.append(Problem("task.rewards", "at least one reward is needed"))
    out += check_template(t.prompt_template)
    if t.kind in ("jsonl", "parquet", "hf") and t.url:
        from rpeg.runtime.datasets.files import RowKeys

        out += check_examples(t.url, t.kind, keys=RowKeys.from_task(t))
    if t.val_url:  # the validation file (rpeg.runtime.task_data)
        from rpeg.runtime.datasets.files import RowKeys
        from rpeg.runtime.task_data import val_kind

        out += check_examples(
            t.val_url, val_kind(t), keys=RowKeys.from_task(t), where="task.val_url"
        )
    for src, rules in t.reward_by_source.items():
        for name in [rules] if isinstance(rules, str) else rules:
            if name not in known:
                out.append(
                    Problem(
                        f"task.reward_by_source[{src!r}]",
                        f"unknown reward {name!r}; registered: {known}",
                    )
                )
    return out
