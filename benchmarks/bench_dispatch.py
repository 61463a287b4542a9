"""How the flow dispatches units: measured step times, same run, interleaved.

    python benchmarks/bench_dispatch.py [--steps 6] [--rounds 4] [--prompts 4] [--samples 4]

Per round (order rotated every round): the single-process trainer (``local``), the flow as
shipped (``direct``: units and takes as direct driver calls, rpeg.tasks.dispatch) and the
flow with every instruction a Prefect task run (``task_runs``: the dispatch before
2026-12-01, obtained by calling ``rpeg.tasks.submit`` without its pool). Built-in task, one
rank, on one LocalCluster and one Prefect test server. Prints medians of all steps but each
run's first, the ratios to ``local``, and per configuration the median per step of the time
inside the actor's stages (``inside``) and outside them (``outside``: task runs, actor round
trips, driver bookkeeping). The machine is shared: quote medians of several runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def _cfg(out: str, steps: int, prompts: int, samples: int):
    from rpeg.config import RunConfig

    return RunConfig.from_dict(
        {
            "workload": {
                "num_prompts": prompts,
                "samples_per_prompt": samples,
                "max_response_tokens": 12,
            },
            "task": {"heldout_size": 4},
            "runtime": {"steps": steps, "output_dir": out},
            "cluster": {"n_workers": 2, "num_devices": 1},
        }
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    a = ap.parse_args(argv)

    import rpeg.tasks
    from prefect.testing.utilities import prefect_test_harness
    from rpeg.flows.entry import train_on
    from rpeg.infra import start_cluster
    from rpeg.tasks import dispatch

    from rpeg.runtime.local_trainer import LocalTrainer

    def task_runs(run, ins, pool=None):  # every instruction a Prefect task run
        return dispatch.submit(run, ins, None)

    tmp = tempfile.mkdtemp(prefix="rpeg-dispatch-")
    steps: dict[str, list[float]] = {}
    inside: dict[str, list[float]] = {}

    def flow(name: str, r: int) -> None:
        rpeg.tasks.submit = task_runs if name == "task_runs" else dispatch.submit
        try:
            s = train_on(
                cl, _cfg(f"{tmp}/{name}{r}", a.steps, a.prompts, a.samples), progress=False
            )
        finally:
            rpeg.tasks.submit = dispatch.submit
        hist = s["_extra"]["history"][1:]
        spans: dict[int, float] = {}
        for sp in s["_extra"]["stage_spans"]:
            if sp["rank"] == 0:
                spans[sp["step"]] = spans.get(sp["step"], 0.0) + sp["end_s"] - sp["start_s"]
        steps.setdefault(name, []).extend(h["step_s"] for h in hist)
        inside.setdefault(name, []).extend(
            spans.get(int(h["step"]) - 1, 0.0) for h in hist
        )  # 1-based

    def local(r: int) -> None:
        t = LocalTrainer(_cfg(f"{tmp}/local{r}", a.steps, a.prompts, a.samples))
        steps.setdefault("local", []).extend([t.step()["step_s"] for _ in range(a.steps)][1:])

    with prefect_test_harness(server_startup_timeout=120), start_cluster(n_workers=2) as cl:
        names = ["local", "direct", "task_runs"]
        for r in range(a.rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                if name == "local":
                    local(r)
                else:
                    flow(name, r)
    med = {k: statistics.median(v) for k, v in steps.items()}
    out = {
        "median_step_s": med,
        "ratio_to_local": {k: med[k] / med["local"] for k in med if k != "local"},
        "inside_actor_stages_s": {k: statistics.median(v) for k, v in inside.items()},
        "outside_actor_stages_s": {
            k: statistics.median(s - i for s, i in zip(steps[k], v, strict=True))
            for k, v in inside.items()
        },
        "n_steps": {k: len(v) for k, v in steps.items()},
        "load_avg": os.getloadavg(),
        "args": vars(a),
    }
    print(json.dumps(out, indent=1))
    print(
        "SUMMARY "
        + " ".join(f"{k}={v:.3f}s" for k, v in med.items())
        + " "
        + " ".join(f"{k}/local={v:.2f}" for k, v in out["ratio_to_local"].items())
    )
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
