"""A batched sampling loop over a Hugging Face causal LM with a KV cache (CPU and GPU).

Prompts are left-padded; the attention mask marks padding, position ids are
``cumsum(mask) - 1`` so every prompt starts at position 0 whatever its padding. Prefill runs
once, then one token per step through ``past_key_values``. Finished rows keep decoding pad
tokens (masked out) until all rows finish or the longest cap is hit;
:meth:`TorchEngine.generate_streaming` runs the same decode and hands out finished prompt
groups while the rest go on (what a streaming rollout unit consumes).

Sharded models (rpeg.runtime.sharding): a tensor-parallel model runs as is -- every rank of a
TP group holds its shard and runs the same decode with the same sampling seed, so all agree
on every token. Row ``i`` samples from its own stream, seeded ``seed + i``
(:mod:`rpeg.runtime.engines.row_sampling`): a batch split over ranks samples what the whole
batch does. Under FSDP the first forward gathers every unit, a collective over the dp
ranks, which decode different prompts; callers hold the units gathered for the whole loop
(``rpeg.runtime.sharding.gathered_blocks``, as ``PolicyWorker.generate`` does), so the later
forwards are local and each rank stops at its own longest row.

Mixture-of-experts routes (``record_routes``, set by the policy when
``algorithm.routing_replay`` is on): every forward's router choices are recorded
(rpeg.runtime.model_io.routing.RouteRecorder) and the output carries ``routes [B, R, L, k]``:
entry ``i`` holds the experts of the position whose forward gave response token ``i`` its
log-prob (the last prompt token for ``i = 0``, response token ``i - 1`` after).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from rpeg.runtime.engines.base import GenerationOutput, SamplingParams
from rpeg.runtime.engines.row_sampling import row_keys, row_uniforms_block, sample_rows


def left_pad(
    prompt_ids: Sequence[Sequence[int]], pad_id: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[[...], ...] -> (ids [B, P], mask [B, P])``, left-padded."""
    rows = [list(x) for x in prompt_ids]
    p = max(len(x) for x in rows)
    # one tensor from one flat list (a per-row copy cost ~5 us a row)
    ids = torch.tensor([[pad_id] * (p - len(x)) + x for x in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in rows], dtype=torch.long)
    return ids.to(device), mask.to(device)


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids ``[B, T]`` for a (left-)padded attention mask: 0 at each row's first token."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Mask logits ``[B, V]`` outside the top-k and the top-p nucleus with ``-inf``."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        cum = probs.cumsum(-1)
        remove = (cum - probs) >= top_p  # keep the smallest prefix whose mass reaches top_p
        remove[..., 0] = False
        mask = torch.zeros_like(remove).scatter(-1, idx, remove)
        logits = logits.masked_fill(mask, float("-inf"))
    return logits


#: the cache keyword of each model class's forward (inspect.signature costs ~20 us, and a
#: decode asks once per token)
_CACHE_KWARG: dict[type, str] = {}


def _cache_kwarg(model) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (older releases)."""
    cls = type(model)
    got = _CACHE_KWARG.get(cls)
    if got is None:
        import inspect

        params = inspect.signature(cls.forward).parameters
        got = _CACHE_KWARG[cls] = "cache" if "cache" in params else "past_key_values"
    return got


class TorchEngine:
    """:class:`~rpeg.runtime.engines.base.GenerationEngine` over a transformers causal LM.

    ``model`` may be shared with the trainer (on-policy: always the latest weights) or be a
    private copy refreshed with :meth:`update_weights` (bounded staleness).
    """

    def __init__(
        self,
        model,
        pad_id: int,
        eos_id: int,
        *,
        use_cache: bool = True,
        policy_version: int = 0,
        compute_dtype: torch.dtype = torch.float32,
    ):
        self.model = model
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.use_cache = use_cache
        self.policy_version = policy_version
        # every forward runs under autocast to this dtype (rpeg.runtime.precision.compute):
        # a trainer's fp32 master weights shared with the engine still decode in bf16
        self.compute_dtype = compute_dtype
        # a RankReduce over the ranks whose forwards are collectives (an FSDP model gathered
        # per forward): they decode in lockstep, the same number of steps, until every
        # rank's rows are done; None: each rank stops at its own longest row
        self.lockstep = None
        # record each router's top-k experts per generated token (GenerationOutput.routes)
        self.record_routes = False

    @property
    def device(self) -> torch.device:
        from torch.distributed.tensor import DTensor

        p = next(self.model.parameters())
        return p._local_tensor.device if isinstance(p, DTensor) else p.device

    def _finished(self, done: torch.Tensor) -> bool:
        if self.lockstep is None:
            return bool(done.all())
        left = torch.tensor([0.0 if bool(done.all()) else 1.0])
        return float(self.lockstep.max(left)[0]) == 0.0  # every rank of the group is done

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """Load full weights (a sharded engine model takes its shard of each)."""
        from rpeg.runtime.sharding import load_full_state_dict

        load_full_state_dict(self.model, state_dict)
        self.policy_version = policy_version

    def update_from(self, source, policy_version: int) -> None:
        """Load the weights of ``source`` = ``(meta, fetch)`` (a trainer's
        ``weight_source``: full tensors gathered one at a time) into this engine's model,
        which keeps its slice of each: the sync never holds a whole copy of the model."""
        from rpeg.runtime.sharding import load_tensors

        meta, fetch = source
        load_tensors(self.model, list(meta), fetch)
        self.policy_version = policy_version

    def _forward(self, ids, mask, pos, past):
        from rpeg.runtime.precision import compute

        kw = {_cache_kwarg(self.model): past} if past is not None else {}
        with compute(ids.device.type, self.compute_dtype):
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                use_cache=past is not None,
                logits_to_keep=1,
                **kw,
            )
        new_past = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        return out.logits[:, -1, :].float(), new_past

    def _route_recorder(self):
        """A route recorder over the model's routers when recording (None otherwise)."""
        if not self.record_routes:
            return None
        from rpeg.runtime.model_io.routing import RouteRecorder, routers

        return RouteRecorder(self.model) if routers(self.model) else None

    def _recorded(self, recorder, st, index: int, r_max: int, ids, mask, pos, past):
        """:meth:`_forward`; with a recorder, the experts of each row's last position are
        written to ``st.routes[:, index]`` (the routes of response token ``index``)."""
        if recorder is None:
            return self._forward(ids, mask, pos, past)
        with recorder:
            recorder.clear()
            out = self._forward(ids, mask, pos, past)
        got = recorder.routes()  # [L, B*T, k]
        b = ids.shape[0]
        last = got.reshape(got.shape[0], b, -1, got.shape[-1])[:, :, -1]  # [L, B, k]
        if st.routes is None:
            st.routes = torch.zeros(
                (b, r_max, got.shape[0], got.shape[-1]), dtype=torch.int16, device=last.device
            )
        if index < r_max:
            st.routes[:, index] = last.permute(1, 0, 2).to(torch.int16)
        return out

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        seed: int | Sequence[int] | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> GenerationOutput:
        t0 = time.perf_counter()
        *_, last = self._decode(prompt_ids, params, seed, max_new_tokens)  # run to the end
        return self._output(last, None, t0)

    def generate_streaming(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        groups: Sequence[Sequence[int]],
        min_groups: int = 1,
        seed: int | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> Iterator[tuple[list[int], GenerationOutput]]:
        """The same decode as :meth:`generate` (same seed, same tokens), releasing finished
        work early: ``groups`` partitions the rows (a prompt's samples); every time
        ``min_groups`` more groups have every row finished, yields ``(group indices, their
        output)`` (rows in the order of the groups' rows) while the batch goes on decoding
        the rest; the last release holds what is left. Always ``ceil(len(groups) /
        min_groups)`` releases, whatever finishes when: ranks that must run the same
        collectives per release (data-parallel forwards on each chunk) agree on the count.
        Continuous batching's early return, in a static batch: nothing is decoded twice."""
        t0 = time.perf_counter()
        m = max(1, min_groups)
        owner = torch.empty(len(prompt_ids), dtype=torch.long)
        for g, rows in enumerate(groups):
            owner[list(rows)] = g
        waiting = torch.ones(len(groups), dtype=torch.bool)  # not finished yet
        ready: list[int] = []  # finished, not yet released (in the order they finished)
        st = None
        for st in self._decode(prompt_ids, params, seed, max_new_tokens):
            left = torch.zeros(len(groups)).index_add_(0, owner, (~st.done.cpu()).float())
            done_now = waiting & (left == 0)
            waiting &= ~done_now
            ready += done_now.nonzero().squeeze(-1).tolist()
            while len(ready) >= m:
                take, ready = ready[:m], ready[m:]
                yield take, self._output(st, [r for g in take for r in groups[g]], t0)
        if st is not None:  # the decode ended: every group is finished
            ready += waiting.nonzero().squeeze(-1).tolist()
            while ready:
                take, ready = ready[:m], ready[m:]
                yield take, self._output(st, [r for g in take for r in groups[g]], t0)

    def _output(self, st: _Decode, rows: list[int] | None, t0: float) -> GenerationOutput:
        """The output of ``rows`` (all when None) from a decode state: responses cut to the
        longest of them, on the CPU (copies: the decode goes on writing its buffers)."""
        sel = slice(None) if rows is None else torch.as_tensor(rows, dtype=torch.long)
        lengths = st.lengths.cpu()[sel]
        r = int(lengths.max()) if lengths.numel() else 0
        dt = time.perf_counter() - t0
        ntok = int(lengths.sum())
        out = GenerationOutput(
            response_ids=st.out_ids.cpu()[sel][:, :r].clone(),
            logprobs=st.out_lp.cpu()[sel][:, :r].clone(),
            lengths=lengths.clone(),
            finished=st.finished.cpu()[sel].clone(),
            policy_version=self.policy_version,
            stats={
                "gen_s": dt,
                "gen_tokens": float(ntok),
                "gen_tokens_per_s": ntok / max(dt, 1e-9),
                "decode_steps": float(st.steps),
            },
        )
        if st.routes is not None:
            out.routes = st.routes.cpu()[sel][:, :r].clone()
        return out

    @torch.no_grad()
    def _decode(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | Sequence[int] | None,
        max_new_tokens: Sequence[int] | None,
    ) -> Iterator[_Decode]:
        """Prefill, then one token per step; yields the state before the first step and
        after every step (its ``done`` rows no longer change)."""
        dev = self.device
        b = len(prompt_ids)
        caps = torch.as_tensor(
            list(max_new_tokens) if max_new_tokens is not None else [params.max_new_tokens] * b,
            dtype=torch.long,
        ).to(dev)
        r_max = int(caps.max())
        if self.lockstep is not None:  # the longest cap of the group
            r_max = int(self.lockstep.max(torch.tensor([float(r_max)]))[0])
        stop = torch.as_tensor(
            sorted({self.eos_id, *params.stop_token_ids}), dtype=torch.long, device=dev
        )
        if seed is None:  # a fresh stream, reproducible under torch.manual_seed
            seed = int(torch.randint(0, 1 << 62, (1,)))
        keys = row_keys(seed, b, dev)  # row i: seed + i, or seed[i] (engines.row_sampling)
        was_training = self.model.training
        self.model.eval()
        try:
            ids, mask = left_pad(prompt_ids, self.pad_id, dev)
            pos = positions_from_mask(mask)
            st = _Decode(
                out_ids=torch.full((b, r_max), self.pad_id, dtype=torch.long, device=dev),
                out_lp=torch.zeros((b, r_max), dtype=torch.float32, device=dev),
                lengths=torch.zeros(b, dtype=torch.long, device=dev),
                finished=torch.zeros(b, dtype=torch.bool, device=dev),
                done=caps <= 0,
            )
            recorder = self._route_recorder()
            if recorder is not None:
                st.routes = None  # [B, R_max, L, k] once the first forward shows L and k
            past = None
            if self.use_cache:
                from transformers import DynamicCache

                cfg = getattr(self.model, "config", None)  # a hybrid model's layer kinds
                past = DynamicCache(config=cfg) if cfg is not None else DynamicCache()
            logits, past = self._recorded(recorder, st, 0, r_max, ids, mask, pos, past)
            full_ids, full_mask = ids, mask
            last_pos = pos[:, -1:]
            yield st
            greedy = params.temperature == 0
            # x / 1.0 == x exactly: no division at temperature 1
            temp = None if greedy or params.temperature == 1.0 else params.temperature
            filtering = not greedy and (
                bool(params.top_k and params.top_k < logits.shape[-1]) or params.top_p < 1.0
            )
            pad = torch.tensor(self.pad_id, dtype=torch.long, device=dev)
            uniforms, u_from = None, 0  # the rows' uniforms of _UNIFORM_BLOCK steps at once
            for t in range(r_max):
                # the end of step t - 1 already asked (nothing changed since): once per step,
                # one collective per token when decoding in lockstep
                if t == 0 and self._finished(st.done):
                    break
                st.steps += 1
                scaled = logits if temp is None else logits / temp
                logp_all = scaled.log_softmax(-1)
                if greedy:
                    tok = scaled.argmax(-1)
                else:
                    if uniforms is None or t - u_from >= uniforms.shape[0]:
                        u_from = t
                        n = min(_UNIFORM_BLOCK, r_max - t)
                        uniforms = row_uniforms_block(keys, t, n)
                    filt = (
                        filter_logits(scaled, params.top_k, params.top_p) if filtering else scaled
                    )
                    tok = sample_rows(filt.softmax(-1), uniforms[t - u_from])
                lp = logp_all.gather(-1, tok[:, None]).squeeze(-1)
                active = ~st.done
                tok = torch.where(active, tok, pad)
                st.out_ids[:, t] = tok
                st.out_lp[:, t] = lp.masked_fill_(st.done, 0.0)
                st.lengths += active
                hit_stop = active & torch.isin(tok, stop)
                st.finished |= hit_stop
                st.done = st.done | hit_stop | (st.lengths >= caps)
                yield st
                if self._finished(st.done):
                    break
                full_mask = torch.cat([full_mask, torch.ones_like(full_mask[:, :1])], dim=1)
                last_pos = last_pos + 1
                if self.use_cache:
                    logits, past = self._recorded(
                        recorder, st, t + 1, r_max, tok[:, None], full_mask, last_pos, past
                    )
                else:
                    full_ids = torch.cat([full_ids, tok[:, None]], dim=1)
                    logits, _ = self._recorded(
                        recorder,
                        st,
                        t + 1,
                        r_max,
                        full_ids,
                        full_mask,
                        positions_from_mask(full_mask),
                        None,
                    )
        finally:
            if was_training:
                self.model.train()


#: decode steps whose sampling uniforms are computed at once (one hash over [steps, B])
_UNIFORM_BLOCK = 64


@dataclass
class _Decode:
    """The decode loop's buffers: ``[B, R_max]`` tokens and sampling log-probs, ``[B]``
    lengths, stop-token flags and done flags (stopped or capped), steps taken."""

    out_ids: torch.Tensor
    out_lp: torch.Tensor
    lengths: torch.Tensor
    finished: torch.Tensor
    done: torch.Tensor
    steps: int = 0
    routes: torch.Tensor | None = None  # [B, R_max, L, k] int16 when recording
