"""A model's tensors from a folder stored in transformers' checkpoint layout, one at a time.

transformers 5 holds a mixture-of-experts layer's experts fused (``mlp.experts.gate_up_proj``
``[E, 2I, H]``, ``mlp.experts.down_proj`` ``[E, H, I]``) while the checkpoints on the Hub (and
``save_pretrained``) store one tensor per expert and matrix (``mlp.experts.<i>.gate_proj.weight``
...; Mixtral's ``block_sparse_moe.experts.<i>.w1``). Its checkpoint conversion mapping
(``transformers.conversion_mapping``) says how: renamings, and converters whose operations
stack the experts (``MergeModulelist``) and join gate and up (``Concatenate``).
:func:`converted_fetch` reads that mapping and builds a model tensor from the folder's tensors
on request, so a sharded rank reads only what it fills (rpeg.runtime.materialize) instead of
loading the whole model. A mapping with another operation is not handled here (None: the
caller loads the folder whole with ``from_pretrained``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Fetch = Callable[[str], torch.Tensor | None]

_HANDLED = {"MergeModulelist", "Concatenate"}


def _plain(pattern: str) -> str:
    """A conversion pattern as a plain substring (the mappings this handles use ``*`` for the
    expert index and no other regex)."""
    return pattern.replace("\\.", ".")


def converted_fetch(model_type: str | None, fetch: Fetch) -> Fetch | None:
    """``fetch`` of the model's names for a folder whose raw tensors ``fetch`` reads, by
    transformers' conversion mapping of ``model_type``; None when the mapping uses an
    operation this module does not implement (or there is none)."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    mapping = get_checkpoint_conversion_mapping(model_type) or []
    renames: list[tuple[str, str]] = []
    converters: list[tuple[list[str], str, list]] = []
    for c in mapping:
        kind = type(c).__name__
        src = [_plain(p) for p in c.source_patterns]
        tgt = [_plain(p) for p in c.target_patterns]
        if kind == "WeightRenaming" and len(src) == len(tgt) == 1 and "*" not in src[0]:
            renames.append((src[0], tgt[0]))
        elif kind == "WeightConverter" and len(tgt) == 1:
            ops = list(c.operations or [])
            if not all(type(o).__name__ in _HANDLED for o in ops):
                return None
            converters.append((src, tgt[0], ops))
        else:
            return None
    if not converters and not renames:
        return None

    def stored(name: str) -> torch.Tensor | None:
        """The folder's tensor of ``name``, under its own name or a renamed one."""
        t = fetch(name)
        for old, new in renames:
            if t is None and new in name:
                t = fetch(name.replace(new, old))
        return t

    def fetch_model(name: str, rows: tuple[int, int] | None = None) -> torch.Tensor | None:
        """The model's tensor ``name``; ``rows``: only its rows ``start:stop`` (experts split
        over ranks: a stacked tensor reads only those experts' entries)."""
        t = stored(name)
        if t is not None:
            return t if rows is None else t[rows[0] : rows[1]]
        for sources, target, ops in converters:
            if not name.endswith(target):
                continue
            prefix = name[: -len(target)]
            parts = [_stack(stored, prefix + s, rows) for s in sources]
            if any(p is None for p in parts):
                continue
            out = parts[0] if len(parts) == 1 else None
            for op in ops:
                if type(op).__name__ == "Concatenate":
                    out = torch.cat(parts, dim=op.dim)
            return out if out is not None else parts[0]
        return None

    return fetch_model


def _stack(stored: Fetch, pattern: str, rows: tuple[int, int] | None = None) -> torch.Tensor | None:
    """``stored(pattern with * = 0, 1, ...)`` stacked on a new first dimension, until a
    missing index (``rows``: indices ``start .. stop - 1`` only); None when none is there."""
    out = []
    if rows is not None:
        for i in range(*rows):
            t = stored(pattern.replace("*", str(i)))
            if t is None:
                return None
            out.append(t)
        return torch.stack(out) if out else None
    while (t := stored(pattern.replace("*", str(len(out))))) is not None:
        out.append(t)
    return torch.stack(out) if out else None
