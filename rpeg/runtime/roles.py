"""Model state holders, one per model role; a Dask actor wraps one of these.

* :class:`PolicyWorker`: an actor (trainable) or reference (frozen) causal LM, optionally with a
  shared value head (actor-critic on one trunk), its optimizer, RNG and generation engine.
  Its loss is its algorithm's recipe's (rpeg.runtime.recipes: where KL goes).
* a separate critic (trunk + value head) and its optimizer: rpeg.runtime.critic.CriticWorker.

Each method is one stage kind: ``generate``, ``compute_logprobs``, ``compute_values``,
``train_step``; ``get_weights``/``set_weights`` sync weights; ``state_dict``/``load_state_dict``
checkpoint everything (weights, optimizer, RNG, policy version).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext

import torch

from rpeg.config import AlgorithmConfig, OptimConfig, WorkloadConfig
from rpeg.errors import ConfigError, Problem
from rpeg.runtime.algorithms import (
    add_sums,
    check_minibatch,
    correction_weights,
    lag_metrics,
    mismatch_from_sums,
    mismatch_sums,
    version_lags,
)
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.engines.base import (
    GenerationEngine,
    GenerationOutput,
    SamplingParams,
    generate_in_groups,
)
from rpeg.runtime.engines.torch_engine import TorchEngine
from rpeg.runtime.micro_batches import MicroBatching, micro_batches
from rpeg.runtime.model_io import ActorCritic, LogprobRequest, lm_logprobs, moe
from rpeg.runtime.packing import pack_micro_batch, packed_forward
from rpeg.runtime.parallel import LOCAL, RankReduce
from rpeg.runtime.precision import compute, frozen_dtype, loss_scaler_for
from rpeg.runtime.recipes import actor_loss, runtime_recipe
from rpeg.runtime.role_state import (
    load_policy_state,
    module_device,
    policy_state,
    role_configs,
)
from rpeg.runtime.sharding import gathered_blocks
from rpeg.runtime.updates import adamw, minibatch_updates, on_device


def routes_engine_problem(mode: str, engine: GenerationEngine) -> Problem:
    """``algorithm.routing_replay`` (``mode``) refused with ``engine`` generating: only the
    torch engine records each token's experts; a vLLM engine says why not
    (rpeg.runtime.engines.vllm_requests.routes_refusal, with the installed vLLM's version)."""
    what = f"{mode!r} needs the torch engine (it records each token's experts); "
    name = type(engine).__name__
    if name != "VLLMEngine":
        return Problem("algorithm.routing_replay", what + f"{name} generates")
    import sys

    from rpeg.runtime.engines.vllm_requests import routes_refusal

    version = getattr(sys.modules.get("vllm"), "__version__", None)
    return Problem(
        "algorithm.routing_replay",
        what + f"vLLM generates and {routes_refusal(version)}: set the engine to torch or "
        "routing_replay to off",
    )


class PolicyWorker:
    """Holds one causal LM (actor or reference) and, if trainable, its optimizer.

    ``engine``: the generation engine; ``None`` builds a :class:`TorchEngine` on this model
    (on-policy: generation always sees the latest weights). Pass another engine (e.g. a vLLM
    engine or a TorchEngine over a copy) for bounded staleness; sync it with :meth:`get_weights`.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        algorithm: AlgorithmConfig | None = None,
        optim: OptimConfig | None = None,
        workload: WorkloadConfig | None = None,
        trainable: bool = True,
        value_head: bool = False,
        engine: GenerationEngine | None = None,
        seed: int = 0,
        reduce: RankReduce = LOCAL,
        compute_dtype: torch.dtype = torch.float32,
    ):
        self.algorithm, self.optim_cfg, self.workload = role_configs(algorithm, optim, workload)
        # what cuts its passes into micro-batches: the compiled unit it runs (set by the
        # stage loop, rpeg.runtime.micro_batches.unit_micro_batches), else its workload's
        self.micro_batching: MicroBatching = self.workload
        self.reduce = reduce  # data-parallel loss normalization (rpeg.runtime.parallel)
        self.tokenizer = tokenizer
        self.trainable = trainable
        self.lm = model
        self.module = ActorCritic(model) if value_head else model
        self.shared_critic = value_head
        self.policy_version = 0
        # the bound k on the version lag of the rows a train step trains on (the trainer
        # sets it: runtime.max_staleness or the plan's); None = not checked
        self.max_staleness: int | None = None
        self._update_lag_max = -1
        # the mismatch measured on the first update's forward (train_step, before_update)
        self._measure_first = self._measuring = False
        self._mm_sums: torch.Tensor | None = None
        self.generator = torch.Generator().manual_seed(seed)
        self.seed = seed
        # forwards run under autocast to it (rpeg.runtime.precision); the weights keep the
        # dtype they were given (fp32 masters for a trainable role: role_builder)
        self.compute_dtype = compute_dtype
        self.loss_scaler = loss_scaler_for(compute_dtype) if trainable else None
        self.engine: GenerationEngine = engine or TorchEngine(
            model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id
        )
        if isinstance(self.engine, TorchEngine):
            self.engine.compute_dtype = compute_dtype
        # ``worker -> engine``: an engine built by apply_layout from the laid-out weights (a
        # vLLM engine of a role built on the meta device: rpeg.runtime.role_builder)
        self.pending_engine: Callable[[PolicyWorker], GenerationEngine] | None = None
        self.shards = None  # rpeg.runtime.sharding.Shards once apply_layout ran
        self.optimizer = None
        if trainable:
            self.optimizer = self._make_optimizer()
        else:
            self.module.requires_grad_(False)
        self.module.eval()
        # mixture-of-experts routing record/replay (algorithm.routing_replay): the
        # RouteReplay on this model's routers, installed at the first forward (after
        # apply_layout); the routing metrics of the last forward
        self._replay = None
        self._route_stats: dict[str, float] | None = None
        if self.algorithm.routing_replay != "off":
            from rpeg.runtime.model_io.routing import routers

            if not routers(self.lm):
                raise ConfigError(
                    [
                        Problem(
                            "algorithm.routing_replay",
                            f"{self.algorithm.routing_replay!r} needs a mixture-of-experts "
                            "model (top-k routers); this model has none: set it to off",
                        )
                    ]
                )

    def _route_replay(self):
        """The RouteReplay on this model's routers (None when routing_replay is off)."""
        if self.algorithm.routing_replay == "off":
            return None
        if getattr(self, "pipeline", None) is not None:
            raise ConfigError(
                [Problem("algorithm.routing_replay", "not under pipeline parallelism (pp > 1)")]
            )
        if self._replay is None:
            from rpeg.runtime.model_io.routing import RouteReplay

            self._replay = RouteReplay(self.lm)
        return self._replay

    def _release_routes(self) -> None:
        """Routers back to their own choice (after a log-prob pass or a train step)."""
        if self._replay is not None:
            self._replay.set(None)

    def _make_optimizer(self):
        groups = [
            {
                "params": [p for p in self.lm.parameters() if p.requires_grad],
                "lr": self.optim_cfg.lr,
            }
        ]
        if self.shared_critic:
            groups.append(
                {
                    "params": list(self.module.value_head.parameters()),
                    "lr": self.optim_cfg.critic_lr,
                }
            )
        return adamw(groups, weight_decay=self.optim_cfg.weight_decay, betas=(0.9, 0.99))

    @property
    def device(self) -> torch.device:
        return module_device(self.lm)

    def apply_layout(
        self,
        layout,
        mesh,
        reduce: RankReduce,
        gen_layout=None,
        gen_mesh=None,
        *,
        source=None,
        device: torch.device | None = None,
        like=None,
    ) -> None:
        """Shard this role over ``mesh`` as ``layout`` says (rpeg.runtime.sharding): tensor
        parallelism of the LM's blocks, FSDP2 over dp; the optimizer is rebuilt over the
        sharded parameters (call before the first step). ``reduce``: the dp group's batch
        statistics. The torch engine generates on the same shards, or -- with a different
        ``gen_layout`` (the plan's generation tp, over ``gen_mesh``) -- on its own copy at that
        layout, refreshed by weight sync; a private engine copy (bounded staleness) is sharded
        at the generation layout too.

        ``source`` (a role built on the meta device: rpeg.runtime.materialize): once laid
        out, every module of the role (LM, value head, the engine's own copy) gets storage on
        ``device`` at its shard's size and is filled from the source, one tensor at a time;
        ``like`` (a frozen role laid out as that LM: the reference beside the actor): the LM
        is filled from ``like``'s shards instead, the source left to the others."""
        from rpeg.runtime.lora import base_copy, has_lora, lora_fetch
        from rpeg.runtime.sharding import shard_roles

        gen_layout = gen_layout or layout
        gen_mesh = gen_mesh if gen_mesh is not None else mesh
        eng = self.engine
        own = (gen_layout.dp, gen_layout.tp, gen_layout.fsdp) != (layout.dp, layout.tp, layout.fsdp)
        pending = self.pending_engine
        if own and pending is None and isinstance(eng, TorchEngine) and eng.model is self.lm:
            # copied before the LM is sharded; synced like the lagging copy (k = 0: every step)
            eng = self.engine = TorchEngine(
                base_copy(self.lm).to(dtype=frozen_dtype(self.compute_dtype)),
                eng.pad_id,
                eng.eos_id,
                policy_version=self.policy_version,
                compute_dtype=self.compute_dtype,
            )
        heads = [self.module.value_head] if self.shared_critic else []
        self.shards = shard_roles(self.module, self.lm, layout, mesh, heads=heads)
        self.reduce = reduce
        if isinstance(eng, TorchEngine) and eng.model is not self.lm:
            shard_roles(eng.model, eng.model, gen_layout, gen_mesh)
        if source is not None:
            from rpeg.runtime.materialize import init_head, materialize, materialize_like

            if device is None:
                raise ValueError("apply_layout: a source needs the device to build on")
            if like is not None:
                materialize_like(self.lm, device, like)
            else:
                fetch = source.fetch
                if has_lora(self.lm):  # base tensors by their base names, adapters initialised
                    fetch = lora_fetch(fetch, self.seed, self.lm)
                materialize(self.lm, device, fetch, "actor" if self.trainable else "reference")
            for h in heads:
                h.to_empty(device=device)
                init_head(h)
            if isinstance(eng, TorchEngine) and eng.model is not self.lm:
                materialize(eng.model, device, source.fetch, "generator")
        if pending is not None:  # a vLLM engine from the laid-out weights (role_builder)
            self.pending_engine = None
            self.engine = pending(self)
        if self.optimizer is not None:  # over the laid-out (and filled) parameters
            self.optimizer = self._make_optimizer()

    # --- generation -----------------------------------------------------------------------
    def encode_prompts(
        self, prompts: Sequence[str], max_prompt_tokens: int | None = None
    ) -> list[list[int]]:
        """Token ids (with BOS) for each prompt; a prompt over ``max_prompt_tokens`` is an error."""
        ids = [self.tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
        if self.tokenizer.bos_token_id is not None:
            ids = [
                x if x[:1] == [self.tokenizer.bos_token_id] else [self.tokenizer.bos_token_id, *x]
                for x in ids
            ]
        limit = max_prompt_tokens or self.workload.max_prompt_tokens
        ctx = getattr(self.lm.config, "max_position_embeddings", None)
        problems = []
        for i, x in enumerate(ids):
            if len(x) > limit:
                problems.append(
                    Problem(
                        f"prompt {i}",
                        f"{len(x)} tokens > workload.max_prompt_tokens={limit}: {prompts[i][:60]!r}",
                    )
                )
            elif ctx is not None and len(x) + self.workload.max_response_tokens > ctx:
                problems.append(
                    Problem(
                        f"prompt {i}",
                        f"{len(x)} prompt + {self.workload.max_response_tokens} response tokens exceed "
                        f"the model context of {ctx} tokens",
                    )
                )
        if problems:
            raise ConfigError(problems, title="prompts do not fit")
        return ids

    def sampling_params(self, greedy: bool = False) -> SamplingParams:
        w = self.workload
        return SamplingParams(
            max_new_tokens=w.max_response_tokens,
            temperature=0.0 if greedy else w.temperature,
            top_p=w.top_p,
            top_k=w.top_k,
        )

    def _decoding(self):
        """The context of a decode loop. An FSDP model whose layout keeps a rank's unsharded
        shard resident anyway (``reshard_after_forward`` false: the extra fits the memory
        share the plan allows) stays gathered for the whole loop (:func:`gathered_blocks`:
        one gather, then each rank stops at its own longest row); otherwise each forward
        gathers one unit at a time -- a rank's peak holds one unit beyond its shard, not the
        whole model -- and the dp ranks decode in lockstep (the engine's ``lockstep``)."""
        if self.algorithm.routing_replay != "off":
            self._route_replay()  # refuses pp > 1
        if self.algorithm.routing_replay != "off" and not isinstance(self.engine, TorchEngine):
            raise ConfigError([routes_engine_problem(self.algorithm.routing_replay, self.engine)])
        model = getattr(self.engine, "model", None)
        if not isinstance(model, torch.nn.Module):
            return nullcontext()
        lay = getattr(self.shards, "layout", None)
        per_forward = (
            model is self.lm
            and lay is not None
            and lay.fsdp
            and lay.dp > 1
            and lay.reshard_after_forward
        )
        from rpeg.runtime.expert_parallel import is_split

        # experts split over ep (rpeg.runtime.expert_parallel): every forward is an all-to-all
        lockstep = per_forward or is_split(model)
        if isinstance(self.engine, TorchEngine):
            over = getattr(self.shards, "lockstep", None) or self.reduce
            self.engine.lockstep = over if lockstep else None
            self.engine.record_routes = self.algorithm.routing_replay != "off"
        self._release_routes()
        return nullcontext() if per_forward else gathered_blocks(model)

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams | None = None,
        *,
        seed: int | Sequence[int] | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> GenerationOutput:
        with self._decoding():
            return self.engine.generate(
                prompt_ids,
                params or self.sampling_params(),
                seed=seed,
                max_new_tokens=max_new_tokens,
            )

    def generate_in_groups(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        groups: Sequence[Sequence[int]],
        min_groups: int = 1,
        seed: int | None = None,
    ) -> Iterator[tuple[list[int], GenerationOutput]]:
        """:meth:`generate`, releasing finished groups of rows as they finish
        (:func:`rpeg.runtime.engines.base.generate_in_groups`)."""
        with self._decoding():
            yield from generate_in_groups(
                self.engine, prompt_ids, params, groups=groups, min_groups=min_groups, seed=seed
            )

    # --- forward passes -------------------------------------------------------------------
    def _forward(
        self,
        mb: RolloutBatch,
        temperature: float,
        *,
        with_entropy: bool = False,
        entropy_grad: bool = False,
    ):
        """-> (log-probs ``[b,R]``, entropy ``[b,R]`` or None, values ``[b,R]`` or None) of a
        micro-batch, on this role's device. Log-probs come from the chunked LM head
        (rpeg.runtime.model_io.lm_logprobs): no ``[b,R,V]`` fp32 logits. A packed unit
        (``seq_packing``) runs the micro-batch's rows end to end without padding
        (rpeg.runtime.packing); the results come back in the padded layout."""
        dev = self.device
        pk = pack_micro_batch(mb, dev) if self.micro_batching.seq_packing else None
        if pk is None:
            ids, mask = mb.input_ids.to(dev), mb.attention_mask.to(dev)
            pos, labels = mb.position_ids.to(dev), mb.response_ids.to(dev)
        else:
            ids, mask, pos, labels = pk.input_ids, None, pk.position_ids, pk.labels
        keep = None if pk is None else pk.keep
        req = LogprobRequest(
            temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad
        )
        rr, self._route_stats = self._route_replay(), None
        p_width = mb.prompt_ids.shape[1]
        if rr is not None:  # replay (or only record) the rollout's experts on the response
            from rpeg.runtime.model_io.routing import replay_inputs

            if mb.routes is None:
                rr.set(None)
            else:
                full, where = replay_inputs(mb.routes.to(dev), mb.response_mask.to(dev), p_width)
                if pk is not None:
                    full, where = pk.tokens(full, dim=1), pk.tokens(where)
                rr.set(full, where, replay=self.algorithm.routing_replay == "rollout")
        with compute(dev.type, self.compute_dtype), packed_forward(self.lm, pk) as fkw:
            if self.shared_critic:
                req, values = self.module.logprobs_and_values(
                    ids, mask, pos, labels, req, keep, **fkw
                )
            else:
                req = lm_logprobs(self.lm, ids, mask, pos, labels, req, keep, **fkw)
                values = None
        # a mixture-of-experts training forward: the router's loss and loads (model_io.moe)
        self._router = req.extra.get("router")
        if rr is not None and mb.routes is not None:
            from rpeg.runtime.model_io.routing import replay_metrics

            self._route_stats = replay_metrics(rr, mb.routes, mb.response_mask, p_width, pk)
        if pk is None:
            return req.logprobs, req.entropy, values
        ent = None if req.entropy is None else pk.unpack(req.entropy)
        return pk.unpack(req.logprobs), ent, None if values is None else pk.unpack(values)

    @torch.no_grad()
    def compute_logprobs(self, batch: RolloutBatch, *, with_entropy: bool = False):
        """Log-probs ``[B,R]`` of the batch's responses under this model (0 on padding);
        with ``with_entropy`` also the per-token entropy ``[B,R]``. On the CPU."""
        if getattr(self, "pipeline", None) is not None:  # pp > 1: rpeg.runtime.pipeline
            from rpeg.runtime.pipeline import pipelined_logprobs

            return pipelined_logprobs(self, batch, with_entropy=with_entropy)
        self.module.eval()
        r = batch.response_ids.shape[1]
        lp_out = torch.zeros((batch.size, r), dtype=torch.float32)
        ent_out = torch.zeros((batch.size, r), dtype=torch.float32) if with_entropy else None
        for ix, mb, real in micro_batches(batch, self):
            lp, ent, _ = self._forward(mb, batch.temperature, with_entropy=with_entropy)
            if not real:
                continue
            m = mb.response_mask
            lp_out[ix, : lp.shape[1]] = lp.float().cpu() * m
            if with_entropy:
                ent_out[ix, : ent.shape[1]] = ent.float().cpu() * m
        self._release_routes()
        return (lp_out, ent_out) if with_entropy else lp_out

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        """Values ``[B,R]`` from the shared value head (actor-critic on one trunk)."""
        return self.compute_logprobs_and_values(batch)[1]

    @torch.no_grad()
    def compute_logprobs_and_values(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Actor-critic sharing: log-probs ``[B,R]`` and values ``[B,R]`` from one forward per
        micro-batch (0 on padding)."""
        if not self.shared_critic:
            raise ConfigError(
                [Problem("algorithm.share_actor_critic", "this policy has no value head")]
            )
        self.module.eval()
        r = batch.response_ids.shape[1]
        lp_out = torch.zeros((batch.size, r), dtype=torch.float32)
        v_out = torch.zeros((batch.size, r), dtype=torch.float32)
        for ix, mb, real in micro_batches(batch, self):
            lp, _, v = self._forward(mb, batch.temperature)
            if not real:
                continue
            m = mb.response_mask
            lp_out[ix, : lp.shape[1]] = lp.float().cpu() * m
            v_out[ix, : v.shape[1]] = v.float().cpu() * m
        self._release_routes()
        return lp_out, v_out

    # --- training -------------------------------------------------------------------------
    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """Minibatched clipped-policy updates over ``batch`` (needs ``advantages`` and
        ``old_logprobs``; uses ``ref_logprobs`` for the KL term, ``values``/``returns`` when
        the critic is shared). Increments :attr:`policy_version` once."""
        if self.optimizer is None:
            raise RuntimeError("train_step on a frozen (reference) worker")
        if batch.advantages is None or batch.old_logprobs is None:
            raise ValueError(
                "train_step needs advantages and old_logprobs (run the advantage stage first)"
            )
        a = self.algorithm
        recipe = runtime_recipe(a.name)  # where KL goes (rpeg.runtime.recipes)
        t0 = time.perf_counter()
        rc = a.rollout_correction
        # stale / old log-probs recomputed anywhere in the data-parallel group: every rank
        # acts alike. Old log-probs that are the engine's own were not compared with the
        # trainer's: the first update's forward (at the old weights) measures the mismatch
        here = torch.tensor(
            [
                int(bool((batch.policy_version < self.policy_version).any())),
                int(not torch.equal(batch.old_logprobs, batch.sample_logprobs)),
            ]
        )
        flags = self.reduce.max(here)
        stale, recomputed = bool(flags[0]), bool(flags[1])
        correct = rc.mode != "none" and (stale or rc.apply_to == "all")
        self._measure_first, self._mm_sums = not recomputed, None
        low, high = rc.bounds()

        dev = self.device

        def micro_loss(micro: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
            micro = on_device(micro, dev)
            lp, ent, values = self._forward(
                micro, batch.temperature, with_entropy=True, entropy_grad=a.entropy_coef != 0
            )
            mask = micro.response_mask
            if self._measuring:  # update 0: lp are the trainer's log-probs at the old weights
                s = mismatch_sums(lp, micro.sample_logprobs, mask, threshold=rc.mismatch_threshold)
                self._mm_sums = s if self._mm_sums is None else add_sums(self._mm_sums, s)
            w, cm = None, {}
            if correct:  # rpeg.runtime.algorithms.mismatch: TIS, masked IS, IcePop
                w, cm = correction_weights(
                    micro.old_logprobs,
                    micro.sample_logprobs,
                    mask,
                    mode=rc.mode,
                    low=low,
                    high=high,
                )
            loss, m = actor_loss(
                recipe, a, micro, lp, ent, values if self.shared_critic else None, w
            )
            if self._router is not None:  # the model's load-balancing loss, its coefficient
                loss = loss + moe.router_loss(self._router)
                m.update(moe.router_metrics(self._router))
            if self._route_stats is not None:  # algorithm.routing_replay (model_io.routing)
                m.update(self._route_stats)
                # every update's log-prob gap to the rollout's (what replay narrows)
                gap = (lp.detach().float() - micro.sample_logprobs).abs() * mask
                m["routing_logprob_gap"] = float(gap.sum() / mask.sum().clamp(min=1))
            m.update(cm)
            return loss, m

        self._update_lag_max = -1
        out = minibatch_updates(self, batch, micro_loss)
        self._release_routes()
        self._measuring = False
        if self._measure_first:  # every rank of the group (a collective)
            none = torch.zeros(5, dtype=torch.float64)
            sums = self._mm_sums if self._mm_sums is not None else none
            out.update(mismatch_from_sums(sums, self.reduce))
        lags = version_lags(self.policy_version, batch.policy_version)
        out.update(
            lag_metrics(
                lags, self.max_staleness, update_lag_max=self._update_lag_max, reduce=self.reduce
            )
        )
        self.policy_version += 1
        dt = time.perf_counter() - t0
        out["train_s"] = dt
        out["train_tokens_per_s"] = a.ppo_epochs * batch.num_tokens / max(dt, 1e-9)
        return out

    def before_update(self, update: int, mini: RolloutBatch | None) -> None:
        """Called by :func:`rpeg.runtime.updates.minibatch_updates` before optimizer update
        ``update`` of a train step on mini-batch ``mini`` (None: this rank holds none of
        its rows): every row's version lag is checked against :attr:`max_staleness` over
        the group (rpeg.runtime.algorithms.lags; a row outside stops the step before it is
        trained on) and the step's largest update lag kept."""
        lags = None if mini is None else version_lags(self.policy_version, mini.policy_version)
        per_step = self.algorithm.ppo_epochs * self.workload.train_minibatches
        top = check_minibatch(
            lags, self.max_staleness, update=update, updates_per_step=per_step, reduce=self.reduce
        )
        self._update_lag_max = max(self._update_lag_max, top)
        # the first update's forward runs at the old weights: it measures the mismatch (of
        # the rows this rank holds; not on the stand-in row of a rank without any)
        self._measuring = self._measure_first and update == 0 and mini is not None

    # --- weights and checkpoints ----------------------------------------------------------
    def get_weights(self, keep_device: bool = False) -> dict[str, torch.Tensor]:
        """The full (unsharded) LM weights (what a generation engine needs) in the compute
        dtype (a generator holds that), detached copies on CPU (``keep_device``: left on
        this rank's GPU, for a sync between GPUs). Sharded: a collective, every rank of the
        group calls it."""
        from rpeg.runtime.lora import sync_state  # LoRA: merged, under the base names

        if getattr(self, "pipeline", None) is not None:  # pp > 1: gathered from the stages
            meta, fetch = self.weight_source()
            return {k: fetch(k) if keep_device else fetch(k).cpu() for k in sorted(meta)}
        return sync_state(self.lm, frozen_dtype(self.compute_dtype), keep_device)

    def weight_source(
        self,
    ) -> tuple[dict[str, tuple[tuple[int, ...], torch.dtype]], Callable[[str], torch.Tensor]]:
        """``(meta, fetch)`` of the full LM weights in the compute dtype, gathered one tensor
        at a time on this rank's device (rpeg.runtime.sharding.full_tensor_source): what a
        weight sync streams into buckets. Sharded: every rank fetches in the same order."""
        from rpeg.runtime.lora import sync_source

        if getattr(self, "pipeline", None) is not None:  # pp > 1: each stage's own tensors
            from rpeg.runtime.pipeline import pipeline_weight_source

            return pipeline_weight_source(self.pipeline, frozen_dtype(self.compute_dtype))
        return sync_source(self.lm, frozen_dtype(self.compute_dtype))

    def set_weights(
        self, weights: Mapping[str, torch.Tensor], policy_version: int | None = None
    ) -> None:
        """Load full LM weights (each rank takes its shard)."""
        from rpeg.runtime.sharding import load_full_state_dict

        load_full_state_dict(self.lm, weights)
        if policy_version is not None:
            self.policy_version = policy_version

    def state_dict(self, weights: bool = True) -> dict:
        """Weights (incl. value head), optimizer, RNG states and policy version
        (rpeg.runtime.role_state.policy_state: sharded, a collective)."""
        return policy_state(self, weights)

    def load_state_dict(self, state: dict) -> None:
        load_policy_state(self, state)
