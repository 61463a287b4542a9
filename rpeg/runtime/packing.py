"""Sequence packing: a micro-batch's rows run end to end as one row, without padding.

A padded micro-batch ``[b, P + R]`` (prompts left-padded, responses right-padded) computes
every row at the micro-batch's longest prompt and response; a packed one computes only the
tokens the rows hold. :func:`pack` lays the attended tokens of each row one after the
other in a ``[1, N]`` row whose position ids restart at 0 for every sequence (the rotary
embeddings see each sequence's own positions), with no attention mask. Inside
:func:`packed_forward` the model's attention (routed once through
``rpeg_packed_<sdpa|eager>``, :func:`install`) gathers each sequence to its own row and
attends it causally, so no token attends across sequences and no ``N x N`` mask is built;
the projections, MLPs and LM head see only the ``N`` real tokens. The LM head keeps only
the positions that predict a response token (``logits_to_keep`` as an index tensor), and
:meth:`Packed.unpack` scatters what it returns back to the ``[b, R]`` layout the losses
read (zeros off the response). The same index moves any per-token tensor of the padded
layout into the packed row (:meth:`Packed.tokens`: recorded expert routes) and back
(:meth:`Packed.padded`).

NeMo-RL's sequence packing and verl's ``use_remove_padding`` do the same with varlen
flash-attention kernels. docs/packing.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Packed:
    """One micro-batch packed. ``input_ids``/``position_ids`` ``[1, N]``: the attended tokens
    of every row, in row order. ``keep [M + 1]``: the packed positions whose hidden states
    predict the ``M`` labels, then the row's last position (the log-prob head drops the last
    kept position, rpeg.runtime.model_io.logprobs). ``labels [1, M]``: the response tokens,
    row ``rows[i]``, column ``cols[i]``. ``flat [N]``: each packed token's index in the
    padded layout flattened (``row * width + column``)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    keep: torch.Tensor
    labels: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    flat: torch.Tensor
    shape: tuple[int, int]  # (b, R): the response layout unpack restores
    width: int  # P + R of the padded layout
    lengths: tuple[int, ...]  # each row's attended tokens, in packed order

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """``[1, M, ...]`` (one value per label) -> ``[b, R, ...]``, zeros elsewhere;
        differentiable in ``x``."""
        out = x.new_zeros((*self.shape, *x.shape[2:]))
        return out.index_put((self.rows, self.cols), x[0])

    def tokens(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """A tensor over the padded layout's ``b * width`` positions along ``dim`` cut to the
        packed row's ``N``."""
        return x.index_select(dim, self.flat.to(x.device))

    def padded(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """:meth:`tokens` inverted: ``N`` packed positions along ``dim`` back to ``b * width``
        (zeros where the padded layout holds padding)."""
        size = list(x.shape)
        size[dim] = self.shape[0] * self.width
        out = x.new_zeros(size)
        return out.index_copy(dim, self.flat.to(x.device), x)


def pack_micro_batch(mb: Any, device: torch.device) -> Packed:
    """:func:`pack` of a micro-batch (a :class:`rpeg.runtime.batch.RolloutBatch`) on
    ``device``, scoring every response token the pass attends to (a multi-turn transcript's
    environment tokens too; the loss mask picks the model's own later)."""
    att = mb.response_mask if mb.response_attention is None else mb.response_attention
    return pack(
        mb.input_ids.to(device),
        mb.attention_mask.to(device),
        mb.position_ids.to(device),
        mb.response_ids.to(device),
        att.to(device),
    )


def pack(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    labels: torch.Tensor,
    label_mask: torch.Tensor,
) -> Packed:
    """Pack a padded micro-batch: ``input_ids``, ``attention_mask``, ``position_ids``
    ``[b, P + R]`` (0-based positions of each row's attended tokens), ``labels [b, R]`` the
    response tokens at columns ``P ..`` and ``label_mask [b, R]`` the ones to score (every
    response token the pass attends to)."""
    b, width = input_ids.shape
    r = labels.shape[1]
    p = width - r
    flat = attention_mask.reshape(-1).bool().nonzero().squeeze(-1)
    n = int(flat.numel())
    where = torch.full((b * width,), -1, dtype=torch.long, device=flat.device)
    where[flat] = torch.arange(n, device=flat.device)
    rows, cols = label_mask.bool().nonzero(as_tuple=True)
    # response token (row, col) sits at padded column p + col; the position before predicts it
    pred = where[rows * width + p - 1 + cols]
    if bool((pred < 0).any()):
        raise ValueError(
            "a scored response token follows a position the attention mask leaves out: "
            "responses must follow their prompts without gaps"
        )
    last = torch.tensor([max(0, n - 1)], dtype=torch.long, device=flat.device)
    return Packed(
        input_ids=input_ids.reshape(-1)[flat][None],
        position_ids=position_ids.reshape(-1)[flat][None],
        keep=torch.cat([pred, last]),
        labels=labels[rows, cols][None],
        rows=rows,
        cols=cols,
        flat=flat,
        shape=(b, r),
        width=width,
        lengths=tuple(int(x) for x in attention_mask.sum(-1).tolist()),
    )


# --- attention over a packed row ---------------------------------------------------------
#: transformers attention implementations that run packed rows through
#: :func:`_packed_attention` (``rpeg_packed_<base>``); other bases (flash-attention,
#: flex-attention) take transformers' own packed path from the position ids
PACKABLE_BASES = ("sdpa", "eager")
_PREFIX = "rpeg_packed_"
#: the keyword a packed forward hands every attention layer (:func:`packed_forward`)
KWARG = "rpeg_packed_rows"
#: set while a packed forward of this thread builds its masks (:func:`packed_forward`)
_PACKING: ContextVar[bool] = ContextVar("rpeg_packing", default=False)


@dataclass(frozen=True)
class PackedRows:
    """Where each sequence of a packed row sits: ``index [S, L]`` (packed positions of
    sequence ``s``'s tokens, padded with its last), ``valid [S, L]``."""

    index: torch.Tensor
    valid: torch.Tensor


def rows_of(lengths: list[int], device: torch.device | str = "cpu") -> PackedRows:
    """The :class:`PackedRows` of sequences of ``lengths`` laid end to end."""
    s, longest = len(lengths), max(lengths) if lengths else 0
    starts = torch.tensor([0, *lengths], dtype=torch.long).cumsum(0)[:-1]
    col = torch.arange(longest, dtype=torch.long)
    lens = torch.tensor(lengths, dtype=torch.long)
    valid = col[None, :] < lens[:, None]
    last = (lens - 1).clamp(min=0)
    index = starts[:, None] + torch.minimum(col[None, :].expand(s, -1), last[:, None])
    return PackedRows(index.to(device), valid.to(device))


def _packed_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention of a packed row ``[1, h, N, d]``: each sequence gathered to its own row of a
    right-padded ``[S, h, L, d]`` and attended by the model's base implementation (sdpa, or
    its eager function: attention sinks, soft-capping and the like stay the model's) under
    the causal mask, within ``sliding_window`` where the layer has one -- the padding follows
    every real token, so causality alone keeps it out -- then laid back end to end. Without
    the packed keyword: the base implementation as is."""
    rows: PackedRows | None = kwargs.pop(KWARG, None)
    base = module.config._attn_implementation[len(_PREFIX) :]
    attend = _base_attention(module, base)
    if rows is None:
        return attend(module, query, key, value, attention_mask, **kwargs)

    def per_row(x: torch.Tensor) -> torch.Tensor:  # [1, h, N, d] -> [S, h, L, d]
        return x[0][:, rows.index].permute(1, 0, 2, 3)

    mask = _causal(rows.index.shape[1], kwargs.get("sliding_window"), base, query)
    if base == "sdpa":
        kwargs["is_causal"] = mask is None
    out, _ = attend(module, per_row(query), per_row(key), per_row(value), mask, **kwargs)
    return out[rows.valid][None], None  # [S, L, h, d] -> [1, N, h, d]


def _causal(length: int, window: int | None, base: str, like: torch.Tensor):
    """The mask of one right-padded row of ``length`` positions in ``base``'s format: None for
    sdpa without a window (its causal kernels); else key ``j`` visible to query ``i`` when
    ``j <= i`` and ``i - j < window`` -- a boolean for sdpa, 0 / the dtype's minimum added to
    the scores for an eager function."""
    if base == "sdpa" and not window:
        return None
    i = torch.arange(length, device=like.device)
    seen = i[None, :] <= i[:, None]
    if window:
        seen &= (i[:, None] - i[None, :]) < window
    if base == "sdpa":
        return seen[None, None]
    low = torch.finfo(like.dtype).min
    zero = torch.zeros((length, length), dtype=like.dtype, device=like.device)
    return zero.masked_fill(~seen, low)[None, None]


def _base_attention(module, base: str):
    if base == "eager":
        import sys

        return sys.modules[type(module).__module__].eager_attention_forward
    from transformers import AttentionInterface

    return AttentionInterface._global_mapping[base]


def _mask_for(base: str):
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    own = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[base]

    def mask(*args, **kw):
        # a packed forward: the attention separates the sequences itself (no N x N mask)
        return None if _PACKING.get() else own(*args, **kw)

    return mask


def _register() -> None:
    """``rpeg_packed_<base>`` in transformers' attention and mask interfaces, in every
    process that imports this module (a model routed here and sent to another process
    finds them there)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for base in PACKABLE_BASES:
        if _PREFIX + base not in AttentionInterface._global_mapping:
            AttentionInterface.register(_PREFIX + base, _packed_attention)
            AttentionMaskInterface.register(_PREFIX + base, _mask_for(base))


def install(lm) -> bool:
    """Route ``lm``'s attention through :func:`_packed_attention` (its base implementation
    for unpacked inputs): True when the model's attention is sdpa or eager (or already
    routed); False for implementations that separate packed sequences themselves. A model
    with layers other than attention (linear attention, mamba) is refused: the compiler
    does not pack it under ``auto`` (UnitPlan.packs)."""
    cfg = lm.config
    from rpeg.runtime.model_io.architectures import hybrid_kinds

    other = hybrid_kinds(cfg)
    if other:
        raise ValueError(
            f"model_type {getattr(cfg, 'model_type', '?')!r} cannot run packed sequences: its "
            f"{'/'.join(other)} layers carry state from one sequence into the next; set the "
            "plan unit's seq_packing: false (docs/packing.md)"
        )
    name = cfg._attn_implementation
    if name.startswith(_PREFIX):
        return True
    if name not in PACKABLE_BASES:
        return False
    _register()
    cfg._attn_implementation = _PREFIX + name
    return True


@contextlib.contextmanager
def packed_forward(lm, packed: Packed | None) -> Iterator[dict]:
    """While inside, a forward of ``lm`` over ``packed``'s row keeps its sequences apart;
    yields the keywords to pass to that forward (none where the model's own attention
    separates packed sequences from their position ids, or ``packed`` is None: a padded
    micro-batch)."""
    if packed is None:
        yield {}
        return
    kw = {KWARG: rows_of(list(packed.lengths), packed.input_ids.device)} if install(lm) else {}
    token = _PACKING.set(True)
    try:
        yield kw
    finally:
        _PACKING.reset(token)


_register()
