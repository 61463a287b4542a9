"""Which pipeline (pp) and context (cp) layouts the runtime's ranks run (pure): the search
drops the others under a named ``runtime:`` reason and the compiler
(rpeg.compile.stage_checks) refuses them by name."""

from __future__ import annotations

from typing import Any

#: model chunks per pipeline rank of each schedule (Megatron's virtual stages: 2 interleaved)
PP_CHUNKS = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2}
#: model families whose decoder the pipeline stages and the context-parallel attention run
#: (transformers' Llama/Qwen2/Qwen3 classes; the built-in model is a Llama)
STAGE_FAMILIES = ("rpeg", "llama", "qwen2", "qwen3")


def layout_refusal(model: Any, pp: int, cp: int, tp: int, schedule: str = "1f1b") -> str:
    """Why one unit's ``pp``/``cp`` cannot run on ``model`` (a catalog ModelSpec; None:
    unknown, not checked), or "" -- the search's named reason."""
    if pp <= 1 and cp <= 1:
        return ""
    if cp > 1 and (tp > 1 or pp > 1):
        return "runtime: cp with tp or pp (context parallelism composes with dp only)"
    if model is None:
        return ""
    if getattr(model, "moe", None) is not None:
        return "runtime: pp/cp on a mixture-of-experts model"
    if model.family not in STAGE_FAMILIES:
        return f"runtime: pp/cp on model family {model.family!r}"
    if pp > 1 and model.layers < pp * PP_CHUNKS.get(schedule, 1):
        return "runtime: fewer layers than pipeline chunks"
    return ""
