"""``predict_grid``: the step over a grid of generation / training efficiency scales from
four pricings of the units and the schedule rebuilt per point, equal to ``predict`` at
every point -- sequential, asynchronous and streamed schedules, and a fused streaming unit
whose time is not affine in the scales (priced at every point)."""

import dataclasses

import pytest

from rpeg.ir import builders, fuse, to_dict
from rpeg.perf import Workload, predict, pricing
from rpeg.perf.calibration import SHIPPED
from rpeg.plan import colocated_plan, disaggregated_plan

WL = Workload(
    num_prompts=64,
    samples_per_prompt=16,
    mean_prompt_tokens=256,
    max_response_tokens=4096,
    mean_response_tokens=1200,
    train_minibatches=4,
)
KW = dict(num_nodes=2, model="llama3.1-8b")
SCALES = (0.25, 0.63, 1.0, 1.59, 4.0)


def _cases():
    g = builders.build("ppo", use_reference=True)
    yield "colocated ppo", g, colocated_plan(g, "dgx-h100", **KW)
    d = disaggregated_plan(g, "dgx-h100", gen_devices=8, train_devices=8, **KW)
    yield "disaggregated k=1", g, d.model_copy(update={"staleness": 1})
    yield "disaggregated k=0", g, d
    yield "streamed k=0", g, d.model_copy(update={"streaming": True})
    g2 = builders.build("grpo", use_reference=False, reward="model")
    gf = fuse(g2, ["generate", "reward"], streaming=True, name="rollout")
    yield "fused streaming", gf, colocated_plan(gf, "dgx-h100", **KW).with_inline_graph(to_dict(gf))


@pytest.mark.parametrize(
    "name,graph,plan", list(_cases()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_the_grid_is_predict_at_every_point(name, graph, plan):
    base = dataclasses.replace(SHIPPED, gen_eff_scale=1.0, train_eff_scale=1.0, fwd_eff_scale=1.0)
    pred, grid = pricing.predict_grid(graph, plan, WL, SCALES, SCALES, calib=base)
    assert pred.step_s == pytest.approx(predict(graph, plan, WL, calib=base).step_s, rel=1e-12)
    for i, g in enumerate(SCALES):
        for j, t in enumerate(SCALES):
            cal = dataclasses.replace(base, gen_eff_scale=g, train_eff_scale=t, fwd_eff_scale=t)
            want = predict(graph, plan, WL, calib=cal, check_memory=False).step_s
            assert grid[i][j] == pytest.approx(want, rel=1e-12), (name, g, t)
    # a higher efficiency never slows the step, and the grid spans the scales' effect
    for i in range(len(SCALES)):
        for j in range(len(SCALES) - 1):
            assert grid[i][j] >= grid[i][j + 1] and grid[j][i] >= grid[j + 1][i]
    assert grid[0][0] > 2 * grid[-1][-1]


def test_a_unit_not_affine_in_the_scales_is_priced_at_every_point(monkeypatch):
    g2 = builders.build("grpo", use_reference=False, reward="model")
    gf = fuse(g2, ["generate", "reward"], streaming=True, name="rollout")
    plan = colocated_plan(gf, "dgx-h100", **KW).with_inline_graph(to_dict(gf))
    calls = []
    real = pricing._stages
    monkeypatch.setattr(pricing, "_stages", lambda s, c: calls.append(1) or real(s, c))
    pricing.predict_grid(gf, plan, WL, SCALES, SCALES, calib=SHIPPED)
    fused = len(calls)
    calls.clear()
    g = builders.build("ppo", use_reference=True)
    pricing.predict_grid(g, colocated_plan(g, "dgx-h100", **KW), WL, SCALES, SCALES, calib=SHIPPED)
    # the prediction, three points of the affine form and three checks of it
    assert len(calls) == 7
    assert fused == 7 + len(SCALES) ** 2  # the streaming overlap's min: every point priced
