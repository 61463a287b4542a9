"""The distributed runtime's own cost per step, against the single process at equal cores.

    python benchmarks/bench_overhead.py [--config configs/builtin.yaml] [--steps 20]
        [--rounds 2] [--local-threads 2] [--profile FILE] [--json FILE] [--calibrate]

Per round (A, B, A, B ...; the order flips every round so both arms see the same load):

* ``local<T>``: the single-process trainer (what ``rpeg train --local`` runs) at T torch
  threads (``--local-threads 2,1``: one arm per count; the summary's ratio is to the first);
* ``dask``: Prefect + Dask (what ``rpeg train`` runs): 2 workers x 1 thread; one Prefect test
  server for the whole benchmark, and each Prefect + Dask run on a LocalCluster of its own,
  started before it and closed after it (no idle cluster beside another arm's run; starts are
  not a step's cost).

Both run the config's workload (default: the built-in task) with ``runtime.steps=--steps``,
no held-out evaluation and no checkpoints; each run's first step is left out. For every
Prefect + Dask step the benchmark splits the step's wall time (the scheduler's ``BeginStep``
to ``EndStep``, the ``step_s`` of its metrics) with the measured timeline:

* ``compute``: the stages' own time, the slowest rank's sum of its stage spans;
* the runtime's own time, ``step - compute``, in four parts:
  ``outside``: the flow and the driver outside the step's actor calls (the scheduler, the
  unit's call being built, the step's release and record), ``to_rank``: from the driver's
  call to the first stage starting on a rank (task submission, serialization of the call,
  Dask's actor round trip out), ``between``: inside the call between and around the stages
  (the slowest rank's call minus its stages: its waits for the other rank, the unit's
  bookkeeping), ``back``: from the last stage's end to the driver holding the results
  (the results' serialization, the round trip back).

``between`` splits into ``gaps`` (the rank with the most stage time: its call's span less its
stages) and ``skew`` (the other ranks' calls outside that span).

Also printed: the CPU seconds per step of the flow process, Prefect's server and Dask's
scheduler (everything but the workers) and of the workers, from one step's start to the next:
the runtime's CPU competes with the ranks for the same cores.

``--profile FILE`` runs cProfile in the flow's thread during the Prefect + Dask runs (where
the driver's direct calls run) and writes its statistics (``python -m pstats FILE``).
``--previous`` adds the arm ``dask_previous``: the driver and the Dask settings as they were
before 2026-12-05 (the flow waiting for each step's drops, samples.jsonl written inside the
step, Dask's 20 ms event-loop tick and 500 ms system monitor), on a second cluster.
``--one-rank`` adds the arm ``dask_1x<T>``: Prefect + Dask with one worker whose one rank runs
at T torch threads (T: the first ``--local-threads``), on its own cluster -- the runtime's
machinery against the single process at the same layout (one rank, T threads), where ``dask``
also changes the layout (two ranks of one thread: data parallel, a gradient sum per update).
``--calibrate`` then runs ``rpeg calibrate`` on the last Prefect + Dask run with
``--runtime-s`` = the median runtime's own time: the performance model's fixed per-step cost
on this machine's cluster comes from this measurement (docs/perf-model.md).

Prints per arm the median step, the ratio of the medians (dask / local) and the median of
each part above, with the load average; one ``SUMMARY`` line at the end. The machine is
shared: quote several runs and the load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

PARTS = ("compute", "runtime", "outside", "to_rank", "between", "back", "gaps", "skew")


def _configs(path: str | None, steps: int, out: str, local_threads: int = 2, dask_workers: int = 2):
    """(local config, dask config) of the same workload: one process at ``local_threads``
    torch threads; ``dask_workers`` workers x 1 thread (1: one worker, one rank at
    ``local_threads`` threads)."""
    from rpeg.config import RunConfig

    base = RunConfig.from_yaml(path) if path else RunConfig()
    common = {
        "runtime.steps": steps,
        "runtime.val_before_train": False,
        "runtime.val_every": 0,
        "runtime.checkpoint_url": None,
    }
    local = base.with_overrides(
        {
            **common,
            "runtime.torch_threads": local_threads,
            "runtime.output_dir": f"{out}/local{local_threads}",
        }
    )
    one = dask_workers == 1
    dask = base.with_overrides(
        {
            **common,
            "runtime.torch_threads": local_threads if one else 1,
            "cluster.n_workers": dask_workers,
            "cluster.num_devices": dask_workers,
            "cluster.threads_per_worker": 1,
            "runtime.output_dir": f"{out}/dask" + ("_1x" if one else ""),
        }
    )
    return local, dask


def split_steps(extra: dict) -> list[dict[str, float]]:
    """Each step of a Prefect + Dask run (``rpeg.flows.entry.train_on(...)["_extra"]``)
    split into compute and the runtime's parts (module docstring); all times in seconds."""
    offsets = {int(k): v for k, v in extra["step_offsets_s"].items()}
    calls: dict[int, list[float]] = {}  # step -> [first unit's start, last unit's end]
    units: dict[int, int] = {}  # step -> units recorded
    for r in extra["timeline"]:
        s = int(r["step"])
        a, b = offsets[s] + r["start_s"], offsets[s] + r["end_s"]
        lo, hi = calls.get(s, (a, b))
        calls[s] = [min(lo, a), max(hi, b)]
        units[s] = units.get(s, 0) + 1
    ranks: dict[int, dict[int, list[float]]] = {}  # step -> rank -> [stage sum, first, last]
    for sp in extra["stage_spans"]:
        s, rk = int(sp["step"]), int(sp["rank"])
        cur = ranks.setdefault(s, {}).setdefault(rk, [0.0, sp["start_s"], sp["end_s"]])
        cur[0] += sp["end_s"] - sp["start_s"]
        cur[1], cur[2] = min(cur[1], sp["start_s"]), max(cur[2], sp["end_s"])
    out = []
    for h in extra["history"]:
        s = int(h["step"]) - 1  # history is 1-based, the timeline 0-based
        if s not in calls or s not in ranks:
            continue
        lo, hi = calls[s]
        per = ranks[s].values()
        compute = max(v[0] for v in per)
        first = min(v[1] for v in per)
        last = max(v[2] for v in per)
        step_s = float(h["step_s"])
        between = (last - first) - compute
        crit = max(per, key=lambda v: v[0])  # the rank with the most stage time
        gaps = crit[2] - crit[1] - crit[0]  # its own time between its stages
        out.append(
            {
                "step": s + 1,
                "step_s": step_s,
                "compute": compute,
                "runtime": step_s - compute,
                "outside": step_s - (hi - lo),
                "to_rank": first - lo,
                "between": between,
                "back": hi - last,
                "gaps": gaps,
                "skew": between - gaps,  # the other ranks' calls outside its call's span
                "units": units.get(s, 0),
            }
        )
    return out


class _CpuProbe:
    """CPU seconds (user + system) so far of this process and its descendants outside the
    workers (the flow process, Prefect's server, Dask's scheduler) and of the workers
    (``pids``); the processes are listed once (a sample reads /proc only)."""

    def __init__(self, pids: set[int]):
        import psutil

        me = psutil.Process()
        self.procs = [me, *me.children(recursive=True)]
        self.pids = pids

    def sample(self) -> tuple[float, float]:
        import psutil

        rest = workers = 0.0
        for pr in self.procs:
            try:
                t = sum(pr.cpu_times()[:2])
            except psutil.Error:  # gone
                continue
            if pr.pid in self.pids:
                workers += t
            else:
                rest += t
        return rest, workers


@contextlib.contextmanager
def _previous_driver():
    """The driver as it was before 2026-12-05, for an A/B in one process (``--previous``,
    on its own cluster with :data:`PREVIOUS_DASK`): the flow waits for every step's drops,
    and samples.jsonl is written inside the step."""
    from rpeg.runtime.actors import driver as D
    from rpeg.runtime.actors import run_samples as RS

    def release_waiting(self, step: int) -> list:
        self.release(step)
        return []

    def write_in_step(self, got: list) -> None:
        if got:
            from rpeg.runtime import samples as SM

            rows = SM.merge(got)
            self.logged.append(rows)
            RS.append_and_print(self.out_dir, rows)

    saved = D.DistributedRun.release_nowait, RS.SampleLog.write
    D.DistributedRun.release_nowait = release_waiting
    RS.SampleLog.write = write_in_step
    try:
        yield
    finally:
        D.DistributedRun.release_nowait, RS.SampleLog.write = saved


#: the Dask settings of the run's cluster before 2026-12-05 (``--previous``)
PREVIOUS_DASK = {
    "distributed.admin.tick.interval": "20ms",
    "distributed.admin.system-monitor.interval": "500ms",
}


@contextlib.contextmanager
def _previous_cluster(dcfg):
    """A second LocalCluster started with :data:`PREVIOUS_DASK` (its workers keep them)."""
    import dask
    from rpeg.infra import cluster as C

    configure = C.configure_dask

    def configure_previous(*args, **kw):
        configure(*args, **kw)
        dask.config.set(PREVIOUS_DASK)

    C.configure_dask = configure_previous
    try:
        cm = C.start_cluster(n_workers=2, torch_threads=1, cluster_config=dcfg.cluster)
        cl = cm.__enter__()
    finally:
        C.configure_dask = configure
        configure(1)  # the shipped settings again for this process
    try:
        yield cl
    finally:
        cm.__exit__(None, None, None)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/builtin.yaml", help="'' = embedded defaults")
    ap.add_argument("--steps", type=int, default=20, help="steps per run (the first left out)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (A,B then B,A)")
    ap.add_argument(
        "--local-threads",
        default="2",
        help="comma list: one local arm per torch thread count (the ratio is to the first)",
    )
    ap.add_argument(
        "--previous",
        action="store_true",
        help="one more arm, dask_previous: the driver and the cluster's Dask settings as "
        "before 2026-12-05, on a second cluster (A/B of the cuts)",
    )
    ap.add_argument(
        "--one-rank",
        action="store_true",
        help="one more arm, dask_1x<T>: one Dask worker, one rank at the first "
        "--local-threads count, on its own cluster (the runtime against the single process "
        "at the same layout)",
    )
    ap.add_argument("--profile", default=None, help="cProfile of the flow thread -> FILE")
    ap.add_argument(
        "--calibrate",
        action="store_true",
        help="then `rpeg calibrate` the last Prefect + Dask run with --runtime-s = the median "
        "runtime's own time: this machine's calibration.yaml (RPEG_SPECS_DIR) gets it",
    )
    ap.add_argument("--json", default=None, help="every step's figures -> FILE")
    a = ap.parse_args(argv)
    if a.steps < 2 or a.rounds < 1:
        ap.error("--steps must be >= 2 and --rounds >= 1")
    try:
        threads = [int(x) for x in a.local_threads.split(",") if x]
    except ValueError:
        threads = []
    if not threads or min(threads) < 1:
        ap.error(f"--local-threads {a.local_threads!r}: a comma list of integers >= 1")

    from prefect.testing.utilities import prefect_test_harness
    from rpeg.flows.entry import train_on
    from rpeg.infra import start_cluster

    from rpeg.runtime.local_trainer import LocalTrainer

    tmp = tempfile.mkdtemp(prefix="rpeg-overhead-")
    one = f"dask_1x{threads[0]}"
    arms = (
        [f"local{t}" for t in threads]
        + ["dask"]
        + (["dask_previous"] if a.previous else [])
        + ([one] if a.one_rank else [])
    )
    steps: dict[str, list[float]] = {k: [] for k in arms}
    parts: dict[str, list[dict[str, float]]] = {}  # Prefect + Dask arm -> its steps' split
    loads: list[float] = []
    # CPU seconds from one step's start to the next's ("<arm>_driver", "<arm>_workers")
    cpu: dict[str, list[float]] = {}
    last_run: list = []  # the config of the last Prefect + Dask run
    prof = None
    if a.profile:
        import cProfile

        prof = cProfile.Profile()

    def local(r: int, t: int) -> None:
        cfg, _ = _configs(a.config or None, a.steps, f"{tmp}/{r}", t)
        tr = LocalTrainer(cfg)
        steps[f"local{t}"] += [tr.step()["step_s"] for _ in range(a.steps)][1:]

    def arm_config(arm: str, out: str):
        """A Prefect + Dask arm's run config: ``one`` one worker at ``threads[0]`` torch
        threads, the others 2 workers x 1 thread."""
        return _configs(a.config or None, a.steps, out, threads[0], 1 if arm == one else 2)[1]

    def dask(r: int, cl, pids: set[int], arm: str = "dask") -> None:
        cfg = arm_config(arm, f"{tmp}/{r}")
        if arm == "dask":
            last_run[:] = [cfg]
        probe = _CpuProbe(pids)  # Prefect's server and Dask's scheduler are up by now
        begins: list[tuple[float, float]] = []  # at each step's start (the flow's hook)
        if prof is not None:
            prof.enable()
        try:
            s = train_on(
                cl,
                cfg,
                progress=False,
                fault_hook=lambda run, step: begins.append(probe.sample()),
            )
        finally:
            if prof is not None:
                prof.disable()
        for (r0, w0), (r1, w1) in list(zip(begins[:-1], begins[1:], strict=True))[1:]:
            cpu.setdefault(f"{arm}_driver", []).append(r1 - r0)
            cpu.setdefault(f"{arm}_workers", []).append(w1 - w0)
        split = split_steps(s["_extra"])[1:]
        steps[arm] += [p["step_s"] for p in split]
        parts.setdefault(arm, []).extend(split)

    t_all = time.perf_counter()
    _, dcfg = _configs(a.config or None, a.steps, tmp)

    def cluster_of(arm: str):
        """The arm's own cluster, started for one run and closed after it: no idle cluster
        of another arm beside a run (its workers' wake-ups preempt a 2-thread team)."""
        if arm == "dask_previous":
            return _previous_cluster(dcfg)
        c = arm_config(arm, tmp)
        return start_cluster(
            n_workers=c.cluster.n_workers,
            torch_threads=c.runtime.torch_threads,
            cluster_config=c.cluster,
        )

    with prefect_test_harness(server_startup_timeout=120):
        for r in range(a.rounds):
            for arm in arms if r % 2 == 0 else list(reversed(arms)):
                loads.append(os.getloadavg()[0])
                if not arm.startswith("dask"):
                    local(r, int(arm[len("local") :]))
                    continue
                previous = arm == "dask_previous"
                with (
                    cluster_of(arm) as cl,
                    _previous_driver() if previous else contextlib.nullcontext(),
                ):
                    pids = set(cl.client.run(os.getpid).values())  # the workers' processes
                    dask(r, cl, pids, arm)
    if prof is not None:
        prof.dump_stats(a.profile)
    med = {k: statistics.median(v) for k, v in steps.items()}
    dasks = [k for k in arms if k.startswith("dask")]
    med_parts = {d: {k: statistics.median(p[k] for p in parts[d]) for k in PARTS} for d in dasks}
    base = arms[0]
    ratio = med["dask"] / med[base]
    units = statistics.median(p["units"] for p in parts["dask"])
    out = {
        "median_step_s": med,
        "ratio_to_local": {
            d: {k: med[d] / med[k] for k in arms if k.startswith("local")} for d in dasks
        },
        "median_parts_s": med_parts,
        "units_per_step": units,
        "cpu_s_per_step": {k: statistics.median(v) for k, v in cpu.items()},
        "n_steps": {k: len(v) for k, v in steps.items()},
        "load_avg_1min_at_runs": loads,
        "load_avg_end": os.getloadavg(),
        "wall_s": time.perf_counter() - t_all,
        "args": vars(a),
    }
    for t in threads:
        k = f"local{t}"
        print(
            f"{k} (1 process, {t} torch thread{'s' if t > 1 else ''}): median step "
            f"{med[k] * 1000:.1f} ms ({len(steps[k])} steps); "
            + ", ".join(f"{d} / {k} = {med[d] / med[k]:.3f}" for d in dasks)
        )
    c = out["cpu_s_per_step"]
    for d in dasks:
        ms = {k: 1000 * v for k, v in med_parts[d].items()}
        shape = f"1 worker x {threads[0]} threads" if d == one else "2 workers x 1 thread"
        print(
            f"{d} (prefect+dask, {shape}): median step {med[d] * 1000:.1f} ms "
            f"({len(steps[d])} steps, {units:.0f} units each): compute {ms['compute']:.1f} ms, "
            f"runtime's own {ms['runtime']:.1f} ms = outside the call {ms['outside']:.1f} + to "
            f"the rank {ms['to_rank']:.1f} + between stages {ms['between']:.1f} (the busiest "
            f"rank's gaps {ms['gaps']:.1f}, the others outside its span {ms['skew']:.1f}) + "
            f"back {ms['back']:.1f} (medians of each part); CPU per step (median, one step's "
            f"start to the next): flow process + Prefect server + Dask scheduler "
            f"{1000 * c[d + '_driver']:.1f} ms, the workers {1000 * c[d + '_workers']:.1f} ms"
        )
    print(f"load average (1 min) at each run's start: {', '.join(f'{x:.2f}' for x in loads)}")
    own = 1000 * med_parts["dask"]["runtime"]
    print(
        f"SUMMARY dask/{base}={ratio:.3f} {base}={med[base] * 1000:.1f}ms "
        f"dask={med['dask'] * 1000:.1f}ms compute={1000 * med_parts['dask']['compute']:.1f}ms "
        f"runtime_own={own:.1f}ms"
        + (
            f" previous_runtime_own={1000 * med_parts['dask_previous']['runtime']:.1f}ms"
            if "dask_previous" in med_parts
            else ""
        )
        + (
            f" {one}/{base}={med[one] / med[base]:.3f} {one}={med[one] * 1000:.1f}ms "
            f"{one}_runtime_own={1000 * med_parts[one]['runtime']:.1f}ms"
            if one in med_parts
            else ""
        )
        + f" load={statistics.fmean(loads):.2f}"
    )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({**out, "steps": steps, "parts": parts}, fh, indent=1)
    if a.calibrate:
        from pathlib import Path

        from rpeg.cli.perf import calibrate_run

        run_dir = Path(last_run[0].runtime.output_dir)
        (run_dir / "config.yaml").write_text(last_run[0].to_yaml())
        own_s = med_parts["dask"]["runtime"]
        print(f"rpeg calibrate {run_dir} --runtime-s {own_s:.4f}")
        calibrate_run(run_dir, None, None, 1, own_s)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
