"""Supervised warm-up of the policy before RL, cached on disk by config hash.

Cache root: ``$RPEG_CACHE`` or ``~/.cache/rpeg``; entry ``warmup/<sha256 of the config>``
holds the warmed-up model and tokenizer (HF format), so reruns skip the warm-up.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import time
from pathlib import Path

import torch

from rpeg.runtime.algorithms.losses import token_logprobs
from rpeg.runtime.data import Example
from rpeg.runtime.engines.torch_engine import left_pad, positions_from_mask

WARMUP_VERSION = "1"


def cache_root() -> Path:
    return Path(os.environ.get("RPEG_CACHE") or Path.home() / ".cache" / "rpeg")


def warmup_key(parts: dict) -> str:
    blob = json.dumps({"v": WARMUP_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sft_batch(tokenizer, examples: list[Example], template: str):
    """(ids [B,L], mask [B,L], loss_mask [B,L]) with loss only on target + EOS tokens."""
    seqs, n_prompt = [], []
    for ex in examples:
        p = tokenizer(ex.prompt(template), add_special_tokens=True)["input_ids"]
        t = tokenizer(ex.target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p + t)
        n_prompt.append(len(p))
    ids, mask = left_pad(seqs, tokenizer.pad_token_id)
    loss_mask = torch.zeros_like(mask)
    width = ids.shape[1]
    for i, (s, n) in enumerate(zip(seqs, n_prompt, strict=True)):
        loss_mask[i, width - len(s) + n :] = 1
    return ids, mask, loss_mask


def supervised_warmup(
    model,
    tokenizer,
    source,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    template: str,
    seed: int,
    log=None,
) -> dict[str, float]:
    """Next-token cross-entropy on ``prompt -> target<eos>`` examples drawn from ``source``."""
    if steps <= 0:
        return {}
    t0 = time.perf_counter()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(steps // 10, 1))
    )
    rng = random.Random(seed)
    dev = next(model.parameters()).device  # the batch goes where the model is
    model.train()
    loss_v = float("nan")
    # a synthetic source is indexable by any integer; a file data set is a finite list
    size = source.__len__() if hasattr(source, "__len__") else None  # None = infinite
    if size == 0:
        raise ValueError("warm-up: the data set is empty")
    span = size or 10**9
    # a source may build its own rows (multi-turn transcripts: rpeg.runtime.envs.tool_task)
    make_batch = getattr(source, "sft_batch", None) or sft_batch
    for step in range(steps):
        exs = [source[rng.randrange(span)] for _ in range(batch_size)]
        ids, mask, lmask = (t.to(dev) for t in make_batch(tokenizer, exs, template))
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)
        ).logits
        lp = token_logprobs(logits[:, :-1], ids[:, 1:])
        m = lmask[:, 1:].float()
        loss = -(lp * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_v = loss.item()
        if log and (step % 50 == 0 or step == steps - 1):
            log(f"warm-up step {step + 1}/{steps}: loss {loss_v:.3f}")
    model.eval()
    return {"warmup_loss": loss_v, "warmup_s": time.perf_counter() - t0}


def cached_warmup(model, tokenizer, source, key_parts: dict, *, log=None, device=None, **kw):
    """Run :func:`supervised_warmup` unless a cached result exists; return (model, info). A
    cached model is read onto ``device`` (None: the CPU)."""
    from rpeg.runtime.model_io import load_model, save_pretrained

    key = warmup_key({**key_parts, **{k: v for k, v in kw.items() if k != "log"}})
    path = cache_root() / "warmup" / key
    if (path / "config.json").exists():
        if log:
            log(f"warm-up: cached at {path}")
        cached = load_model(str(path), device=device)
        return cached, {"warmup_cached": 1.0, "warmup_path": str(path)}
    info = supervised_warmup(model, tokenizer, source, log=log, **kw)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    save_pretrained(model, tokenizer, str(tmp))
    with contextlib.suppress(OSError):  # another process won the race; keep theirs
        tmp.rename(path)
    return model, {**info, "warmup_cached": 0.0, "warmup_path": str(path)}
