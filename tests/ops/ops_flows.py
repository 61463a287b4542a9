"""Flows and a serve entry for the ops integration tests.

``python tests/ops/ops_flows.py serve --config C --checkpoint-url U --data-glob G --output-dir O``
serves (one runner, this process) three deployments built the way ``rpeg deploy`` builds
them (:func:`rpeg.flows.deployments.build_spec`: form defaults from the config, prefect.yaml's
concurrency limit):

* ``retrain/ci-retrain``: the real retrain flow (engine=local, tiny config), no schedule;
* ``train/ci-train``: the training form flow, i.e. the Dask step loop on a LocalCluster;
* ``ops-heartbeat/ci-heartbeat``: a 1-second flow that uses the artifact helpers; the
  schedule test gives it an interval schedule through the API.
"""

from __future__ import annotations

import sys
import time

from rpeg.infra.cluster import prefect_env

prefect_env()

from prefect import flow  # noqa: E402
from rpeg.flows import artifacts as art  # noqa: E402


@flow(name="ops-heartbeat", persist_result=False)
def heartbeat(steps: int = 3) -> dict:
    hist = []
    for s in range(steps):
        m = {"step": s + 1, "reward_mean": 0.1 * s, "step_s": 0.01}
        hist.append(m)
        art.publish_step(s + 1, steps, m)
        time.sleep(0.05)
    art.publish_metrics_table(hist)
    return {"steps": steps}


def serve_main(argv: list[str]) -> None:
    import argparse

    from prefect import serve
    from rpeg.flows import deployments as dp

    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--checkpoint-url", required=True)
    ap.add_argument("--data-glob", required=True)
    ap.add_argument("--output-dir", required=True)
    a = ap.parse_args(argv)
    retrain = dp.build_spec(
        a.config,
        job="retrain",
        name="ci-retrain",
        params=[
            f"checkpoint_url={a.checkpoint_url}",
            f"data_glob={a.data_glob}",
            f"output_dir={a.output_dir}",
            "engine=local",
            "steps=2",
        ],
    )
    train = dp.build_spec(
        a.config,
        job="train",
        name="ci-train",
        params=[
            f"checkpoint_url={a.checkpoint_url}-train",
            f"output_dir={a.output_dir}-train",
            "steps=2",
        ],
    )
    serve(
        dp.to_runner_deployment(retrain),
        dp.to_runner_deployment(train),
        # no schedule here: the schedule test adds one through the API and deletes it
        heartbeat.to_deployment(name="ci-heartbeat", parameters={"steps": 2}),
        print_starting_message=False,
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve_main(sys.argv[2:])
