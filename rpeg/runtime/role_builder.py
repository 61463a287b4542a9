"""The model roles of one process (actor, reference, critic), built one way for both
runtimes: the single-process :class:`rpeg.runtime.local_trainer.LocalTrainer` (every role)
and each :class:`rpeg.runtime.actors.rank.RankActor` (the roles of its actor group).

What differs between the two is said in arguments, never in a second copy of the code:
which roles the process holds, whether the actor trains, whether the generator keeps its
own lagging copy of the weights, which engine generates, and where the model lives.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch

from rpeg.compile.rank_program import RoleInputs
from rpeg.config import RunConfig
from rpeg.ir.recipes import recipe
from rpeg.runtime import compute_thread
from rpeg.runtime.critic import CriticWorker
from rpeg.runtime.data import DataCursor, Example
from rpeg.runtime.engines.choice import build_engine
from rpeg.runtime.rewards import RewardSet
from rpeg.runtime.roles import PolicyWorker
from rpeg.runtime.task_data import build_task_data, task_sources

#: the roles a process may hold
ROLE_NAMES = ("actor", "reference", "critic")


def folder_fingerprint(path: str) -> list[tuple[str, int, int]]:
    """``(name, size, mtime_ns)`` of a model folder's config and weight files: part of the
    warm-up cache key, so another model written at the same path is warmed up afresh."""
    from pathlib import Path

    folder = Path(path)
    if not folder.is_dir():
        return []
    out = []
    for f in sorted(folder.iterdir()):
        if f.name == "config.json" or f.name.endswith((".safetensors", ".safetensors.index.json")):
            st = f.stat()
            out.append((f.name, st.st_size, st.st_mtime_ns))
    return out


def build_policy(
    config: RunConfig | RoleInputs,
    log: Callable[[str], None] | None = None,
    device: torch.device | None = None,
):
    """(model, tokenizer, info): the configured model, or the built-in tiny model; with the
    supervised warm-up applied (cached) when ``config.warmup_sft_steps`` > 0. ``device``
    (not the CPU): a model from ``model.path`` is read straight onto it
    (``model_io.load_on_device``: no copy in host memory); the tiny model is initialised on
    the CPU (the same weights on every device for a seed) and warmed up on ``device``."""
    from rpeg.runtime.model_io import TINY_SHAPE, create_tiny, load_model_and_tokenizer

    mc = config.model
    torch.manual_seed(config.runtime.seed)
    if mc.path:
        model, tok = load_model_and_tokenizer(mc.path, mc.dtype, device=device)
        key_model = {"path": mc.path, "files": folder_fingerprint(mc.path)}
    else:
        shape = dict(mc.tiny_shape or {})
        model, tok = create_tiny(seed=config.runtime.seed, **shape)
        if device is not None:
            model.to(device)  # 4M parameters: warmed up where it will run
        key_model = {"tiny": {**TINY_SHAPE, **shape}, "seed": config.runtime.seed}
    info: dict = {}
    o = config.optim
    warmup_steps = config.warmup_sft_steps
    if warmup_steps:
        from rpeg.runtime.warmup import cached_warmup

        cursor, _ = build_task_data(config.task, tok, config.workload.max_prompt_tokens)
        t = config.task
        model, info = cached_warmup(
            model,
            tok,
            cursor.source if not cursor.finite else list(cursor.source),
            key_parts={
                "model": key_model,
                "task": [t.kind, t.url, t.difficulty, t.seed, t.heldout_size, t.prompt_template]
                + ([t.prompt_key, t.answer_key, t.system_prompt, t.chat_template] if t.url else [])
                + ([t.multiturn.model_dump()] if t.multiturn.env else [])
                # a validation file leaves the training data whole (older keys unchanged)
                + ([{"val_url": t.val_url}] if t.val_url else []),
            },
            steps=warmup_steps,
            lr=o.warmup_sft_lr,
            batch_size=o.warmup_sft_batch_size,
            template=t.prompt_template,
            seed=config.runtime.seed,
            log=log,
            device=device,
        )
    return model, tok, info


def build_policy_meta(config: RunConfig | RoleInputs, log: Callable[[str], None] | None = None):
    """(model on the meta device, tokenizer, info, source): :func:`build_policy` for a rank
    that builds its roles sharded (rpeg.runtime.materialize). A ``model.path`` folder without
    a warm-up is read tensor by tensor from its safetensors files when each role is filled
    (the whole model is never in memory); the built-in model and a warmed-up one are built as
    :func:`build_policy` builds them (one seeded pass, so the weights are the same as an
    unsharded run's) and serve as the source until every role is filled."""
    from rpeg.runtime.materialize import ModuleSource, SafetensorsSource, meta_causal_lm
    from rpeg.runtime.model_io import load_tokenizer, torch_dtype
    from rpeg.runtime.model_io.loading import fetch_folder, model_config

    mc = config.model
    if mc.path and not config.warmup_sft_steps:
        local = fetch_folder(mc.path, "model.path")
        cfg = model_config(local, "model.path", mc.path)
        model = meta_causal_lm(cfg, torch_dtype(mc.dtype))
        return model, load_tokenizer(local), {}, SafetensorsSource(local)
    full, tok, info = build_policy(config, log)
    meta = meta_causal_lm(full.config, next(full.parameters()).dtype)
    return meta, tok, info, ModuleSource(full)


def all_roles(config: RunConfig) -> tuple[str, ...]:
    """The roles of a process that runs the whole step (the local trainer): the actor, a
    frozen reference when the algorithm uses one, a separate critic for PPO without a
    shared actor-critic."""
    a = config.algorithm
    roles = ["actor"]
    r = recipe(a.name)
    if a.use_reference and r.uses_reference:
        roles.append("reference")
    if r.critic and not a.share_actor_critic:
        roles.append("critic")
    return tuple(roles)


@dataclass
class Roles:
    """What :func:`build_roles` made: the task's data and rewards, the tokenizer, and the
    roles this process holds (None where it holds none)."""

    rewards: RewardSet
    cursor: DataCursor
    heldout: list[Example]
    tokenizer: Any
    warmup_info: dict = field(default_factory=dict)
    actor: PolicyWorker | None = None
    reference: PolicyWorker | None = None
    critic: CriticWorker | None = None
    #: the initial weights of roles built on the meta device (``sharded_build``): each role
    #: is filled from it once laid out (rpeg.runtime.materialize); None otherwise
    source: Any = None


def build_roles(
    config: RunConfig | RoleInputs,
    roles: Collection[str],
    *,
    engine: str,
    actor_trainable: bool = True,
    lagging_engine: bool = False,
    colocated: bool = True,
    place: Callable[[torch.nn.Module], Any] | None = None,
    log: Callable[[str], None] | None = None,
    compute_dtype: torch.dtype | None = None,
    engine_memory: float | None = None,
    engine_eager: bool = False,
    device: torch.device | None = None,
    sharded_build: bool = False,
) -> Roles:
    """The task's data and rewards and the ``roles`` (of :data:`ROLE_NAMES`) of one process.

    ``engine``: the generation engine, ``torch`` or ``vllm`` (used only when the process
    holds the actor), resolved once by the one rule
    (:func:`rpeg.runtime.engines.choice.rank_engine`: a rank's from its ``RankProgram``, the
    local trainer's for its group); a vLLM engine always holds its own weights, a torch one
    only with ``lagging_engine`` (a bounded-staleness generator); ``colocated``: the engine
    shares its device with
    training (vLLM sleep mode); ``engine_memory``: the plan's ``gpu_memory_utilization`` of
    the generate unit for a vLLM engine (None: the plan schema's default); ``engine_eager``:
    its ``enforce_eager`` (a vLLM engine without CUDA graphs). ``place(model)``
    moves the built model before any role copies it (a rank's device); ``device``: where the model is built
    (:func:`build_policy`), so ``place`` has nothing to move.

    Precision (rpeg.runtime.precision): trainable roles hold fp32 master weights; frozen ones
    (the reference, a generator's own copy, an actor that only generates) hold
    ``compute_dtype``; every forward runs under autocast to ``compute_dtype`` (None: the
    compiler's rule for ``workload.precision`` on the model's device).

    ``sharded_build``: the roles are built on the meta device and :attr:`Roles.source` holds
    their initial weights; the caller lays each role out and fills it from the source
    (``apply_layout(..., source=...)``), so the process never holds a whole copy of any
    role (LoRA adapters included: rpeg.runtime.lora.lora_fetch). A vLLM engine is then
    built by the actor's ``apply_layout`` from the laid-out actor's weights
    (``PolicyWorker.pending_engine``)."""
    unknown = sorted(set(roles) - set(ROLE_NAMES))
    if unknown:
        raise ValueError(f"roles {unknown}: allowed {', '.join(ROLE_NAMES)}")
    c = config
    a = c.algorithm
    # this thread runs the roles at runtime.torch_threads; any other thread at one
    compute_thread.claim(c.runtime.torch_threads)
    random.seed(c.runtime.seed)
    rewards = RewardSet.from_task(c.task)
    source = None
    if sharded_build:
        model, tok, info, source = build_policy_meta(c, log)
    else:
        model, tok, info = build_policy(c, log, device)
    cursor, heldout = build_task_data(c.task, tok, c.workload.max_prompt_tokens)
    rewards.use_sources(task_sources(cursor, heldout))  # rewards by data_source: its columns
    if place is not None and source is None:
        place(model)
    from rpeg.compile.layouts import compute_dtype_name
    from rpeg.runtime.model_io import torch_dtype
    from rpeg.runtime.precision import MASTER_DTYPE, frozen_dtype

    if compute_dtype is None:
        dev = next(model.parameters()).device.type
        compute_dtype = torch_dtype(compute_dtype_name(c.workload.precision, dev, c.model.dtype))
    frozen = frozen_dtype(compute_dtype)
    model.to(dtype=MASTER_DTYPE)  # masters (a no-op for the fp32 default)
    out = Roles(rewards, cursor, heldout, tok, info, source=source)
    ppo = recipe(a.name).critic
    if "reference" in roles:
        out.reference = PolicyWorker(
            copy.deepcopy(model).to(dtype=frozen),
            tok,
            workload=c.workload,
            trainable=False,
            compute_dtype=compute_dtype,
        )
        # a LoRA run's reference is the frozen base: rebuilt from its source, never checkpointed
        out.reference.rebuilt_from_source = c.model.lora is not None
    if "actor" in roles:
        own_engine = None
        pending_engine = None
        kind = engine
        if sharded_build and kind == "vllm":
            # built once the actor is laid out and filled, from its shards (a collective):
            # vLLM receives the weights bucket by bucket, no rank holds a whole copy first
            def pending_engine(worker, kind=kind, tok=tok):
                return build_engine(
                    kind,
                    worker.lm,
                    tok,
                    config=c,
                    colocated=colocated,
                    gpu_memory_utilization=engine_memory,
                    enforce_eager=engine_eager,
                    source=worker.weight_source(),  # LoRA: merged
                )

        elif kind == "vllm" or lagging_engine:  # a generator with its own weights
            own_engine = build_engine(
                kind,
                model,
                tok,
                config=c,
                colocated=colocated,
                gpu_memory_utilization=engine_memory,  # the plan's (vLLM's KV-cache share)
                enforce_eager=engine_eager,
            )
            if isinstance(getattr(own_engine, "model", None), torch.nn.Module):
                own_engine.model.to(dtype=frozen)
        if not actor_trainable:
            model.to(dtype=frozen)
        elif c.model.lora is not None:  # adapters on the trained actor, after the copies above
            from rpeg.runtime.lora import apply_lora

            model = apply_lora(model, c.model.lora, seed=c.runtime.seed)
        out.actor = PolicyWorker(
            model,
            tok,
            algorithm=a,
            optim=c.optim,
            workload=c.workload,
            trainable=actor_trainable,
            value_head=ppo and a.share_actor_critic,
            engine=own_engine,
            seed=c.runtime.seed,
            compute_dtype=compute_dtype,
        )
        out.actor.pending_engine = pending_engine  # PolicyWorker.apply_layout builds it
        # multi-turn tasks: greedy_accuracy rolls out through the environment too
        out.actor.multiturn = c.task.multiturn if c.task.multiturn.env else None
    if "critic" in roles:
        from rpeg.runtime.lora import base_copy  # a LoRA actor's base, without adapters

        out.critic = CriticWorker(
            base_copy(model).to(dtype=MASTER_DTYPE),
            algorithm=a,
            optim=c.optim,
            workload=c.workload,
            seed=c.runtime.seed,
            compute_dtype=compute_dtype,
        )
    return out


def greedy_accuracy(
    actor: PolicyWorker,
    tokenizer: Any,
    examples: list[Example],
    rewards: RewardSet,
    prompt_template: str,
) -> float:
    """Greedy accuracy of the actor's *current* weights on ``examples`` (a fraction in
    [0, 1]; NaN without examples), even when its generator lags behind: generation runs on
    a torch engine over the actor's own model (rpeg.runtime.validation)."""
    from rpeg.runtime.validation import accuracy_of, validation_metrics

    return accuracy_of(validation_metrics(actor, tokenizer, examples, rewards, prompt_template))
