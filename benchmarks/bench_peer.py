"""RPEG against the systems a user would pick instead, at equal cores, on one peer workload.

    python benchmarks/bench_peer.py [--steps 40] [--rounds 2] [--threads 1,2]
        [--systems trl,hand,local,dask] [--shape tiny|micro] [--env K=V ...]
        [--trl-python /tmp/trl-venv/bin/python] [--json FILE]

The workload: a random-weights tiny Hugging Face Llama (the ``rpeg-tiny`` shape: hidden 256,
4 layers, 4 heads, FFN 1024, character-level vocabulary of 100, 4.2M parameters; ``--shape
micro``: hidden 64, 2 layers, FFN 256) written to a folder by this script, a GSM8K-like JSONL of ``question`` / ``answer`` rows with a rule
reward (the last number of the response equals the answer), GRPO with 16 prompts x 8 samples
a step, a 12-token response cap, temperature 1 (no top-k / top-p), no KL and no reference
model (TRL's default ``beta=0``), one optimizer update a step over all 128 samples (AdamW,
lr 1e-4, gradient clip 1.0), token-mean loss; 40 steps. Run by:

* ``trl``: TRL's ``GRPOTrainer`` (``per_device_train_batch_size=128``, ``num_generations=8``,
  ``max_completion_length=12``, ``use_cpu``); run with ``--trl-python`` (a venv with ``trl``:
  ``python -m venv --system-site-packages /tmp/trl-venv && /tmp/trl-venv/bin/pip install -c
  constraints/cpu.txt trl``); left out, saying so, where it does not import;
* ``hand``: a minimal GRPO loop in plain torch / transformers: HF ``generate`` (KV cache,
  sampling), one forward + backward of the sampled sequences, AdamW;
* ``local``: RPEG's single-process trainer (``LocalTrainer.run``, what ``rpeg train --local``
  runs) at ``runtime.torch_threads`` = T;
* ``dask``: RPEG on Prefect + Dask (``run_train`` on a test Prefect server and a
  LocalCluster started in the arm's process): T workers x 1 thread, so the same T cores
  (T = 1: one worker); ``dask1w``: one worker of T threads (a plan keeping the cores in one
  rank);
* ``localnr``, ``dasknr``, ``dask1wnr``: the same with the default plan's layer recompute
  left to the compiler's memory rule (``recompute: auto``) instead of ``true``.

``--env K=V`` sets a variable in every arm (``OMP_WAIT_POLICY=PASSIVE``: OpenMP threads that
sleep instead of spinning between parallel regions, which decides 2-thread runs on a loaded
machine).

Every arm is a fresh process with ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` = T and
``torch.set_num_threads(T)``, arms interleaved (the order reversed every other round) so all
see the same load. A step is the wall time from one step's start to the next's (logging and
bookkeeping between steps included); the first ``--skip`` steps of each run are left out
(warm-up). Also the CPU seconds a step of
all the arm's processes (its own and every descendant: Prefect's server, Dask's scheduler
and workers), from one step's start to the next: on a shared machine the wall time follows
the load, the CPU time much less. Prints each arm's median step, the ratio to the best TRL
arm at the same T, and one ``SUMMARY`` line. Not a test: ``tests/test_bench_peer.py`` only parses its arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEMS = ("trl", "hand", "local", "dask", "dask1w", "localnr", "dasknr", "dask1wnr")
PROMPTS, SAMPLES, RESPONSE, LR = 16, 8, 12, 1e-4
MARK = "PEER_RESULT "


# --- the workload ---------------------------------------------------------------------------
#: model shapes (``--shape``): ``tiny`` is rpeg-tiny's; ``micro`` a model so small that a
#: step is mostly the systems' own machinery (per-token Python, bookkeeping), not matmuls
SHAPES: dict[str, dict[str, int]] = {
    "tiny": {},
    "micro": {
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
    },
}


def write_workload(
    folder: str, rows: int = 1024, seed: int = 0, shape: str = "tiny"
) -> tuple[str, str]:
    """The model folder and the data file under ``folder``: (model dir, jsonl path)."""
    import random

    from rpeg.runtime.model_io import create_tiny, save_pretrained

    model_dir = os.path.join(folder, f"{shape}-llama")
    data = os.path.join(folder, "train.jsonl")
    model, tok = create_tiny(seed=seed, **SHAPES[shape])
    save_pretrained(model, tok, model_dir)
    rng = random.Random(seed)
    with open(data, "w") as fh:
        for _ in range(rows):
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            q = f"What is {a} plus {b}? Answer:"
            fh.write(json.dumps({"question": q, "answer": str(a + b)}) + "\n")
    return model_dir, data


def read_rows(data: str) -> list[dict]:
    with open(data) as fh:
        return [json.loads(line) for line in fh if line.strip()]


_NUM = re.compile(r"-?\d+")


def rule_reward(response: str, answer: str) -> float:
    """1 when the response's last number equals the answer (the GSM8K rule), else 0."""
    got = _NUM.findall(response)
    return 1.0 if got and got[-1] == answer else 0.0


_MARKS: list[tuple[float, float]] = []  # (wall, CPU s of this process tree) at each step's start
_TREE: list = []


def _mark() -> None:
    """Record a step's start: wall time and the CPU seconds so far of this process and its
    descendants (Prefect's server, Dask's scheduler and workers: every process a system
    runs; the list is taken at the first mark, when all of them are up)."""
    import psutil

    if not _TREE:
        me = psutil.Process()
        _TREE[:] = [me, *me.children(recursive=True)]
    cpu = 0.0
    for pr in _TREE:
        try:
            cpu += sum(pr.cpu_times()[:2])
        except psutil.Error:  # gone
            continue
    _MARKS.append((time.perf_counter(), cpu))


def _threads(t: int) -> None:
    import torch

    torch.set_num_threads(t)
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(t)


# --- the arms (each in a process of its own) ------------------------------------------------
def arm_trl(model_dir: str, data: str, steps: int, threads: int, out: str) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    _threads(threads)
    rows = read_rows(data)
    ds = Dataset.from_list([{"prompt": r["question"], "answer": r["answer"]} for r in rows])

    def reward(completions, answer, **_):
        return [rule_reward(c, a) for c, a in zip(completions, answer, strict=True)]

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            _mark()

        def on_train_end(self, args, state, control, **kw):
            _mark()

    cfg = GRPOConfig(
        output_dir=out,
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=PROMPTS * SAMPLES,
        gradient_accumulation_steps=1,
        num_generations=SAMPLES,
        max_completion_length=RESPONSE,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        learning_rate=LR,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=steps,
        logging_steps=10**6,
        save_strategy="no",
        report_to=[],
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tr = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=cfg,
        train_dataset=ds,
        processing_class=tok,
        callbacks=[Clock()],
    )
    tr.train()


def arm_hand(model_dir: str, data: str, steps: int, threads: int, out: str) -> None:
    """GRPO in plain torch / transformers: what the other systems do, nothing more."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _threads(threads)
    torch.manual_seed(0)
    rows = read_rows(data)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    pad, eos = tok.pad_token_id, tok.eos_token_id
    for s in range(steps):
        _mark()
        batch = rows[(s * PROMPTS) % len(rows) :][:PROMPTS]
        prompts = [r["question"] for r in batch for _ in range(SAMPLES)]
        enc = tok(prompts, return_tensors="pt", padding=True)
        p = enc["input_ids"].shape[1]
        model.eval()
        with torch.no_grad():
            seq = model.generate(
                **enc,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=RESPONSE,
                pad_token_id=pad,
                eos_token_id=eos,
            )
        comp = seq[:, p:]
        is_eos = comp == eos  # the response up to and with its first eos
        after = (is_eos.cumsum(1) - is_eos.long()) > 0
        cmask = (~after).float()
        texts = tok.batch_decode(comp, skip_special_tokens=True)
        r = torch.tensor(
            [
                rule_reward(t, row["answer"])
                for t, row in zip(texts, [b for b in batch for _ in range(SAMPLES)], strict=True)
            ]
        ).view(PROMPTS, SAMPLES)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
        model.train()
        mask = torch.cat([enc["attention_mask"], cmask.long()], dim=1)
        logits = model(input_ids=seq, attention_mask=mask, logits_to_keep=comp.shape[1] + 1).logits
        lp = logits[:, :-1].float().log_softmax(-1).gather(-1, comp[..., None]).squeeze(-1)
        ratio = torch.exp(lp - lp.detach())
        loss = -(ratio * adv[:, None] * cmask).sum() / cmask.sum().clamp(min=1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    _mark()


def rpeg_config(model_dir: str, data: str, steps: int, threads: int, out: str, workers: int = 0):
    """The workload as an RPEG run config (``workers``: a Prefect + Dask cluster's)."""
    from rpeg.config import RunConfig

    over = {
        "model.path": model_dir,
        "algorithm.name": "grpo",
        "algorithm.use_reference": False,
        "algorithm.kl_coef": 0.0,
        "algorithm.loss_aggregation": "token_mean",
        "task.kind": "jsonl",
        "task.url": data,
        "task.prompt_key": "question",
        "task.answer_key": "answer",
        "task.rewards": ["exact_numeric"],
        "task.heldout_size": 16,
        "workload.num_prompts": PROMPTS,
        "workload.samples_per_prompt": SAMPLES,
        "workload.max_response_tokens": RESPONSE,
        "workload.max_prompt_tokens": 32,
        "workload.train_minibatches": 1,
        "workload.micro_batch_size": PROMPTS * SAMPLES,
        "optim.lr": LR,
        "optim.grad_clip": 1.0,
        "runtime.steps": steps,
        "runtime.val_before_train": False,
        "runtime.val_every": 0,
        "runtime.checkpoint_url": None,
        # a random-weights model never earns the reward: every advantage is 0, which RPEG
        # stops after 20 such steps by default (DegenerateTraining); TRL goes on. Warn only.
        "runtime.degenerate_steps_limit": 0,
        "runtime.torch_threads": threads,
        "runtime.output_dir": out,
    }
    if workers:
        over.update(
            {
                "cluster.n_workers": workers,
                "cluster.threads_per_worker": threads,
            }
        )
    return RunConfig().with_overrides(over)


def arm_local(model_dir: str, data: str, steps: int, threads: int, out: str) -> None:
    from rpeg.runtime.local_trainer import LocalTrainer

    _threads(threads)
    tr = LocalTrainer(rpeg_config(model_dir, data, steps, threads, out))
    step = tr.step

    def timed():
        _mark()
        return step()

    tr.step = timed
    tr.run(steps, out)  # the run's end (plot, greedy evaluation) is no step: not marked


def arm_dask(
    model_dir: str, data: str, steps: int, threads: int, out: str, one_worker: bool = False
) -> None:
    """T workers x 1 thread (``one_worker``: 1 worker x T threads)."""
    from prefect.testing.utilities import prefect_test_harness
    from rpeg.infra import start_cluster

    _threads(1 if not one_worker else threads)
    workers, per = (1, threads) if one_worker else (threads, 1)
    cfg = rpeg_config(model_dir, data, steps, per, out, workers=workers)
    with (
        prefect_test_harness(server_startup_timeout=120),
        start_cluster(
            n_workers=workers,
            threads_per_worker=per,
            torch_threads=per,
            cluster_config=cfg.cluster,
        ) as cl,
    ):
        _train_on(cl, cfg, lambda run, step: _mark())


def _train_on(cluster, cfg, hook):
    """The distributed run on ``cluster`` with ``hook(run, step)`` at each step's start, its
    summary with ``_extra`` (rpeg.flows' test seam, wherever this checkout has it)."""
    try:
        from rpeg.flows.entry import train_on
    except ImportError:
        try:
            from rpeg.flows.seam import train_on
        except ImportError:  # before the seam: run_train's private arguments
            from rpeg.flows.train import run_train

            return run_train(
                cfg, progress=False, _cluster=cluster, _with_extra=True, _fault_hook=hook
            )
    return train_on(cluster, cfg, fault_hook=hook, progress=False)


ARMS = {"trl": arm_trl, "hand": arm_hand, "local": arm_local, "dask": arm_dask}


def _default_plan_recompute(value) -> None:
    """The default plan (no ``plan`` in the config) with its training units'
    ``recompute`` = ``value`` ("auto": the compiler's memory rule) instead of ``true``: the
    ``...nr`` arms (an A/B of layer recompute in the single-process default plan)."""
    import functools

    import rpeg.plan as P

    P.colocated_plan = functools.partial(P.colocated_plan, recompute=value)
    P.disaggregated_plan = functools.partial(P.disaggregated_plan, recompute=value)


def child(a: argparse.Namespace) -> None:
    sysname = a.child
    if sysname.endswith("nr"):
        _default_plan_recompute("auto")
        sysname = sysname[: -len("nr")]
    fn = ARMS.get(sysname)
    kw = {}
    if sysname == "dask1w":
        fn, kw = arm_dask, {"one_worker": True}
    out = tempfile.mkdtemp(prefix=f"peer-{sysname}-")
    t0 = time.perf_counter()
    fn(a.model_dir, a.data, a.steps, a.child_threads, out, **kw)
    pairs = list(zip(_MARKS[:-1], _MARKS[1:], strict=True))
    got = {
        "steps": [b[0] - a[0] for a, b in pairs],
        "cpu": [b[1] - a[1] for a, b in pairs],
        "wall_s": time.perf_counter() - t0,
    }
    print(MARK + json.dumps(got), flush=True)


# --- the parent ---------------------------------------------------------------------------
def run_arm(a, sysname: str, t: int, model_dir: str, data: str) -> dict:
    py = a.trl_python if sysname == "trl" else sys.executable
    env = dict(os.environ, OMP_NUM_THREADS=str(t), MKL_NUM_THREADS=str(t))
    env.update(kv.split("=", 1) for kv in a.env)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [py, os.path.abspath(__file__), "--child", sysname, "--child-threads", str(t)]
    cmd += ["--model-dir", model_dir, "--data", data, "--steps", str(a.steps)]
    load = os.getloadavg()[0]
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    got = [ln for ln in p.stdout.splitlines() if ln.startswith(MARK)]
    if p.returncode != 0 or not got:
        tail = (p.stderr or p.stdout).strip().splitlines()[-8:]
        return {"error": f"rc {p.returncode}: " + " | ".join(tail), "load": load}
    res = json.loads(got[-1][len(MARK) :])
    res["load"] = load
    return res


def trl_available(py: str) -> str | None:
    """None when ``py`` imports trl, else why not."""
    p = subprocess.run([py, "-c", "import trl"], capture_output=True, text=True)
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="steps per run")
    ap.add_argument("--skip", type=int, default=3, help="first steps of each run left out")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    ap.add_argument("--threads", default="1,2", help="comma list of thread (core) counts")
    ap.add_argument("--systems", default="trl,hand,local,dask", help=f"of {','.join(SYSTEMS)}")
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES), help="model shape")
    ap.add_argument("--trl-python", default="/tmp/trl-venv/bin/python")
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="an environment variable of every arm (e.g. OMP_WAIT_POLICY=PASSIVE)",
    )
    ap.add_argument("--workdir", default=None, help="where the model and data go (a temp dir)")
    ap.add_argument("--json", default=None, help="every step of every arm -> FILE")
    ap.add_argument("--child", default=None, choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--child-threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    systems = [s for s in a.systems.split(",") if s]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        ap.error(f"--systems: unknown {bad}; of {list(SYSTEMS)}")
    try:
        a.thread_list = [int(x) for x in a.threads.split(",") if x]
    except ValueError:
        a.thread_list = []
    if not a.thread_list or min(a.thread_list) < 1:
        ap.error(f"--threads {a.threads!r}: a comma list of integers >= 1")
    if a.steps <= a.skip or a.rounds < 1:
        ap.error("--steps must exceed --skip, and --rounds be >= 1")
    a.system_list = systems
    if any("=" not in kv for kv in a.env):
        ap.error(f"--env {a.env}: K=V")
    return a


def main(argv: list[str] | None = None) -> dict:
    a = parse(argv)
    if a.child:
        child(a)
        return {}
    systems = list(a.system_list)
    if "trl" in systems:
        why = trl_available(a.trl_python)
        if why:
            print(f"trl left out: {a.trl_python} does not import trl ({why})")
            systems.remove("trl")
    work = a.workdir or tempfile.mkdtemp(prefix="rpeg-peer-")
    model_dir, data = write_workload(work, shape=a.shape)
    # dask1w at 1 thread is dask at 1 thread (one worker of one thread)
    arms = [
        (s, t) for t in a.thread_list for s in systems if not (s.startswith("dask1w") and t == 1)
    ]
    steps: dict[str, list[float]] = {f"{s}{t}": [] for s, t in arms}
    cpus: dict[str, list[float]] = {f"{s}{t}": [] for s, t in arms}
    loads: list[float] = []
    errors: dict[str, str] = {}
    t_all = time.perf_counter()
    for r in range(a.rounds):
        for s, t in arms if r % 2 == 0 else list(reversed(arms)):
            res = run_arm(a, s, t, model_dir, data)
            loads.append(res["load"])
            key = f"{s}{t}"
            if "error" in res:
                errors[key] = res["error"]
                print(f"round {r} {key}: FAILED {res['error']}", flush=True)
                continue
            got, cpu = res["steps"][a.skip :], res["cpu"][a.skip :]
            steps[key] += got
            cpus[key] += cpu
            print(
                f"round {r} {key}: median {statistics.median(got) * 1000:.1f} ms over "
                f"{len(got)} steps, CPU {statistics.fmean(cpu) * 1000:.1f} ms a step (load "
                f"{res['load']:.2f}, wall {res['wall_s']:.0f} s)",
                flush=True,
            )
    med = {k: statistics.median(v) for k, v in steps.items() if v}
    # the mean: the kernel counts CPU time in 10 ms ticks, too coarse for one step's median
    med_cpu = {k: statistics.fmean(v) for k, v in cpus.items() if v}
    print(
        f"\nmedian step per arm ({a.shape} model, {a.steps} steps, first {a.skip} left out, "
        f"{a.rounds} rounds):"
    )
    for t in a.thread_list:
        ref = med.get(f"trl{t}")
        for s in systems:
            k = f"{s}{t}"
            if k in med:
                rel = f", {med[k] / ref:.2f}x trl{t}" if ref else ""
                print(
                    f"  {k:<9} {t} core(s): {med[k] * 1000:8.1f} ms{rel}; CPU "
                    f"{med_cpu[k] * 1000:8.1f} ms a step (mean, all its processes)"
                )
    best = {
        s: min((med[f"{s}{t}"] for t in a.thread_list if f"{s}{t}" in med), default=None)
        for s in systems
    }
    ref = best.get("trl") or best.get("hand")
    name = "trl" if best.get("trl") else "hand"
    mean_load = statistics.fmean(loads) if loads else float("nan")
    parts = [f"{s}_best={best[s] * 1000:.1f}ms" for s in systems if best[s]]
    if ref:
        parts += [f"{s}/{name}={best[s] / ref:.2f}x" for s in systems if best[s] and s != name]
    if "local2" in med and "dask2" in med:
        parts.append(f"dask2/local2={med['dask2'] / med['local2']:.2f}x")
    print("SUMMARY " + " ".join(parts) + f" load={mean_load:.2f}")
    print("CPU a step (ms): " + " ".join(f"{k}={v * 1000:.0f}" for k, v in med_cpu.items()))
    out = {
        "median_step_s": med,
        "mean_cpu_s": med_cpu,
        "best_s": best,
        "errors": errors,
        "loads": loads,
        "wall_s": time.perf_counter() - t_all,
        "args": {k: v for k, v in vars(a).items()},
    }
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({**out, "steps": steps, "cpu": cpus}, fh, indent=1)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
