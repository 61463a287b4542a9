"""Supervised warm-up of the policy before RL, cached on disk by config hash.

Cache root: ``$RPEG_CACHE`` or ``~/.cache/rpeg``; entry ``warmup/<sha256 of the config>``
holds the warmed-up model and tokenizer (HF format), so reruns skip the warm-up.

Once per run, not once per rank: the entry is computed under a file lock
(``warmup/<key>.lock``, ``flock``): the first process computes it while the others wait
(saying so every :data:`WARMUP_LOG_EVERY_S` seconds) and then read it (issue 41: both ranks
of a distributed run computed the same warm-up, two ``.tmp`` folders). The distributed
runtime's driver warms up before the ranks start when they run on CPU
(``rpeg.flows.run_setup.warm_up_before_ranks``), so its lines reach the console. Progress: a line at the
first and last step and whenever :data:`WARMUP_LOG_EVERY_S` seconds passed.
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
#: seconds between two warm-up progress lines (the first and last step always have one)
WARMUP_LOG_EVERY_S = 5.0


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
    t_line = t0
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
        now = time.perf_counter()
        if log and (step == 0 or step == steps - 1 or now - t_line >= WARMUP_LOG_EVERY_S):
            t_line = now
            left = (now - t0) / (step + 1) * (steps - step - 1)
            log(
                f"warm-up step {step + 1}/{steps}: loss {loss_v:.3f} ({now - t0:.0f} s"
                + (f", ~{left:.0f} s left)" if step < steps - 1 else ")")
            )
    model.eval()
    return {"warmup_loss": loss_v, "warmup_s": time.perf_counter() - t0}


def _cache_path(key_parts: dict, kw: dict) -> Path:
    key = warmup_key({**key_parts, **{k: v for k, v in kw.items() if k != "log"}})
    return cache_root() / "warmup" / key


@contextlib.contextmanager
def _entry_lock(path: Path, log=None):
    """Hold ``<entry>.lock`` (``flock``; released when the process dies); while another
    process holds it, say so every WARMUP_LOG_EVERY_S seconds."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        t0 = time.monotonic()
        t_line = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if log and (t_line is None or now - t_line >= WARMUP_LOG_EVERY_S):
                    log(f"warm-up: another process computes it; waiting ({now - t0:.0f} s)")
                    t_line = now
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # releases the lock


def cached_warmup(model, tokenizer, source, key_parts: dict, *, log=None, device=None, **kw):
    """Run :func:`supervised_warmup` unless a cached result exists; return (model, info). A
    cached model is read onto ``device`` (None: the CPU). One process computes an entry,
    the others wait for it (module doc)."""
    from rpeg.runtime.model_io import load_model, save_pretrained

    path = _cache_path(key_parts, kw)

    def cached():
        if log:
            log(f"warm-up: cached at {path}")
        return load_model(str(path), device=device), {
            "warmup_cached": 1.0,
            "warmup_path": str(path),
        }

    if (path / "config.json").exists():
        return cached()
    with _entry_lock(path, log):
        if (path / "config.json").exists():  # computed while this process waited
            return cached()
        info = supervised_warmup(model, tokenizer, source, log=log, **kw)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        save_pretrained(model, tokenizer, str(tmp))
        with contextlib.suppress(OSError):  # another host's process won the race
            tmp.rename(path)
    return model, {**info, "warmup_cached": 0.0, "warmup_path": str(path)}
