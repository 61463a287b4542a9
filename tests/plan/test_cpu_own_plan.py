"""The planner on this machine's CPU cluster prices plans as ``rpeg predict`` does, and never
picks a plan it prices slower than the config's own.

* sizing: a CPU cluster keeps the machine's cores (local-cpu: 2); a plan's workers beyond
  them time-share them (rpeg.perf.time_sharing.run_cluster, one path for the planner and
  ``rpeg calibrate``; ``rpeg predict`` and ``rpeg bench`` price the catalog cluster);
* the space holds the config's own unit settings (rpeg.search.problem.OwnSettings)."""

import json

import pytest
import yaml

from rpeg import specs
from rpeg.cli import main
from rpeg.compile.sources import resolve
from rpeg.perf import predict
from rpeg.perf.time_sharing import run_cluster
from rpeg.preflight import load_config
from rpeg.search.optimizer import SearchOptions, optimize_problem
from rpeg.search.problem import default_space, problem_from_config


def test_a_cpu_cluster_keeps_the_machines_cores():
    # local-cpu (clusters.yaml): 1 node x 2 cores; 4 workers do not make it 2 nodes
    cl = run_cluster("local-cpu", 4)
    assert (cl.num_nodes, cl.gpus_per_node, cl.num_devices) == (1, 2, 2)
    # an accelerator cluster is sized to the devices: gh200-alps has 4 per node, 10 -> 3 nodes
    assert run_cluster("gh200-alps", 10).num_nodes == 3
    prob = problem_from_config(load_config("configs/sharded-cpu.yaml"))
    assert prob.num_devices == 4 and prob.cluster.num_devices == 2


def test_the_planners_price_of_the_configs_plan_is_rpeg_predicts(tmp_path, capsys):
    cfg = load_config("configs/sharded-cpu.yaml")
    prob = problem_from_config(cfg)
    graph, plan = resolve(None, cfg)
    # what the planner's Evaluator.price calls for a plan of this problem
    planner = predict(graph, plan, prob.workload, cluster=prob.cluster, model=prob.model)
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(plan.to_dict()))
    assert main(["predict", str(path), "--config", "configs/sharded-cpu.yaml", "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)["step_s"]
    assert planner.step_s == pytest.approx(predicted, rel=1e-9)
    # and 4 workers on the 2 cores cost more than the same plan on 4 cores would
    four = specs.cluster("local-cpu", num_devices=4)
    assert planner.step_s > predict(graph, plan, prob.workload, cluster=four).step_s


@pytest.mark.parametrize(
    "path, mbs, engines, tp",
    [
        # the built-in config's plan: every unit at workload.micro_batch_size (64), auto
        ("configs/builtin.yaml", (1, 2, 4, 64), ("auto",), (1,)),
        # sharded-cpu's plan section: micro-batches 1 and 64, tp 1 and 2, fsdp training
        ("configs/sharded-cpu.yaml", (1, 2, 4, 64), ("auto", "fsdp"), (1, 2)),
    ],
)
def test_the_space_holds_the_configs_own_settings(path, mbs, engines, tp):
    so = default_space(problem_from_config(load_config(path)))
    assert so.micro_batch_sizes == mbs and so.engines == engines and so.tp == tp


@pytest.mark.parametrize("path", ["configs/builtin.yaml", "configs/sharded-cpu.yaml"])
def test_the_chosen_plan_is_never_priced_slower_than_the_configs_own(path):
    cfg = load_config(path)
    prob = problem_from_config(cfg)
    graph, plan = resolve(None, cfg)
    own = predict(graph, plan, prob.workload, cluster=prob.cluster, model=prob.model).step_s
    best = optimize_problem(prob, options=SearchOptions(), baselines=False).best
    assert best.step_s <= own * (1 + 1e-9)
