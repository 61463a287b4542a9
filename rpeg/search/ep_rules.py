"""Which expert-parallel layouts the runtime runs (rpeg.runtime.expert_parallel), as one pure
rule for the plan search (a named ``runtime:`` reason) and the compiler (a problem naming the
numbers): the plan never holds an ep the ranks cannot split.

The runtime splits the experts of a transformers model's fused ``*Experts`` modules over ``ep``
consecutive data-parallel ranks (all-to-all dispatch and combine); tested with Mixtral (catalog
family ``llama``), Qwen3-MoE (``qwen3``), gpt-oss and Qwen3-Next
(tests/runtime/models/test_expert_parallel.py). ep composes with dp (replicas or FSDP2 over the
non-expert parameters), not with tp, pp or cp."""

from __future__ import annotations

from typing import Any

#: model families (rpeg.specs) whose MoE layers the runtime splits over ep
EP_FAMILIES = ("llama", "qwen3", "gpt-oss", "qwen3-next")


def ep_refusal(
    model: Any, ep: int, *, tp: int = 1, pp: int = 1, cp: int = 1, dp: int = 1
) -> tuple[str, str]:
    """``(reason, detail)`` why the runtime cannot run ``ep`` for ``model`` at this layout,
    ``("", "")`` when it can. ``reason`` is fixed text (the search counts layouts under it),
    ``detail`` names the numbers (the compiler's problem)."""
    if ep <= 1:
        return "", ""
    name = getattr(model, "name", "?")
    moe = getattr(model, "moe", None)
    if moe is None:
        return "ep>1 on a dense model", f"model {name!r} has no experts to split (a dense model)"
    family = getattr(model, "family", "")
    if family not in EP_FAMILIES:
        return (
            "ep>1 for a model family the runtime does not split",
            f"model {name!r} (family {family!r}): the runtime splits the experts of "
            f"{', '.join(EP_FAMILIES)} models only",
        )
    if moe.experts % ep:
        return (
            "ep does not divide the experts",
            f"ep={ep} does not divide {name!r}'s {moe.experts} experts",
        )
    if tp > 1 or pp > 1 or cp > 1:
        return (
            "ep>1 with tp/pp/cp>1 (ep composes with dp and FSDP only)",
            f"ep={ep} with tp={tp}, pp={pp}, cp={cp}: expert parallelism runs with tp=pp=cp=1 "
            "(its ep groups are dp ranks)",
        )
    if dp % ep:
        return (
            "ep does not divide dp",
            f"ep={ep} does not divide dp={dp} (an ep group is ep dp ranks)",
        )
    return "", ""
