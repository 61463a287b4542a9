"""Context parallelism (rpeg.runtime.context_parallel): the zigzag split, refusals by name;
on two spawned gloo ranks (slow) cp=2 gives the one-process log-probs, losses, gradients and
weights on the built-in tiny model widened to 8 layers."""

from __future__ import annotations

import pytest
import torch

from rpeg.errors import ConfigError
from rpeg.runtime.context_parallel import apply_context_parallel, zigzag_columns

TOL = 1e-5


def test_zigzag_split_covers_the_sequence_with_equal_causal_work():
    cols = [zigzag_columns(16, 2, r) for r in range(2)]
    assert cols[0].tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert cols[1].tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert sorted(torch.cat(cols).tolist()) == list(range(16))
    # query-key pairs under the causal mask: the same on both ranks
    assert [int((c + 1).sum()) for c in cols] == [68, 68]


def test_context_parallel_refuses_a_shared_value_head_by_name():
    from rpeg.runtime.model_io import create_tiny
    from rpeg.runtime.roles import PolicyWorker

    m, tok = create_tiny(seed=0, num_hidden_layers=2, hidden_size=32, intermediate_size=64)
    with pytest.raises(ConfigError, match="algorithm.share_actor_critic"):
        apply_context_parallel(PolicyWorker(m, tok, value_head=True), None, 0, 2)


@pytest.mark.slow  # two spawned ranks
def test_cp2_equals_single_process():
    import pipeline_cases as C

    cfg = C.config()
    ref = C.reference(cfg)
    out = C.spawn(2, [("cp", "context_case", (cfg,))], port=29951, timeout_s=200)["cp"]
    for res in out.values():
        torch.testing.assert_close(res["logprobs"], ref["logprobs"], atol=TOL, rtol=0)
        for k in ("pg_loss", "kl", "entropy", "grad_norm"):
            assert res["metrics"][k] == pytest.approx(ref["metrics"][k], abs=TOL), k
        assert set(res["grads"]) == set(ref["grads"])
        for k, g in res["grads"].items():
            torch.testing.assert_close(g, ref["grads"][k], atol=TOL, rtol=0, msg=k)


@pytest.mark.slow  # four spawned ranks
def test_cp2_x_dp2_equals_single_process():
    import pipeline_cases as C

    cfg = C.config()
    ref = C.reference(cfg)
    out = C.spawn(4, [("cp_dp", "context_case", (cfg, 2))], port=29971, timeout_s=300)["cp_dp"]
    for r, res in out.items():
        rows = C.S.rows_of(r // 2, 2)
        torch.testing.assert_close(res["logprobs"], ref["logprobs"][rows], atol=TOL, rtol=0)
        assert res["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], abs=TOL)
        for k, g in res["grads"].items():
            torch.testing.assert_close(g, ref["grads"][k], atol=TOL, rtol=0, msg=k)
    for k in ("pg_loss", "kl", "entropy"):  # each dp index's share: their mean is the loss
        assert (out[0]["metrics"][k] + out[2]["metrics"][k]) / 2 == pytest.approx(
            ref["metrics"][k], abs=TOL
        ), k


def _check_fsdp_cp(out, ref, dp: int, world: int) -> None:
    """Each rank of fsdp x cp: the one-process log-probs of its rows, gradients and gradient
    norm (1e-5), the losses' mean over dp, and ``1/world`` of the parameter bytes held."""
    cp = world // dp
    for r, res in out.items():
        rows = C_rows(r // cp, dp)
        torch.testing.assert_close(res["logprobs"], ref["logprobs"][rows], atol=TOL, rtol=0)
        assert res["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], abs=TOL)
        assert set(res["grads"]) == set(ref["grads"])
        for k, g in res["grads"].items():
            torch.testing.assert_close(g, ref["grads"][k], atol=TOL, rtol=0, msg=k)
        assert res["sharded"]
        # FSDP2 pads each tensor's dim 0 to a multiple of the ranks: within a few rows of 1/world
        assert res["held"] <= res["full_bytes"] / world * 1.02, (res["held"], res["full_bytes"])
    for k in ("pg_loss", "kl", "entropy"):  # each dp index's share: their mean is the loss
        mean = sum(out[d * cp]["metrics"][k] for d in range(dp)) / dp
        assert mean == pytest.approx(ref["metrics"][k], abs=TOL), k


def C_rows(dp_index: int, dp: int) -> list[int]:
    import pipeline_cases as C

    return C.S.rows_of(dp_index, dp)


@pytest.mark.slow  # two spawned ranks
def test_fsdp_cp2_equals_single_process_on_half_the_parameters():
    import pipeline_cases as C

    cfg = C.config()
    ref = C.reference(cfg)
    out = C.spawn(2, [("f", "context_fsdp_case", (cfg, 1))], port=29981, timeout_s=200)["f"]
    _check_fsdp_cp(out, ref, 1, 2)


@pytest.mark.slow  # four spawned ranks, built on the meta device
def test_fsdp_cp2_x_dp2_equals_single_process_on_a_quarter_of_the_parameters():
    import pipeline_cases as C

    cfg = C.config()
    ref = C.reference(cfg)
    out = C.spawn(4, [("f", "context_fsdp_case", (cfg, 2, True))], port=29983, timeout_s=300)
    _check_fsdp_cp(out["f"], ref, 2, 4)


@pytest.mark.slow  # two spawned ranks, two layouts
def test_a_checkpoint_at_fsdp_cp2_resumes_at_dp2(tmp_path):
    import pipeline_cases as C

    cfg = C.config()
    ref = C.reference_steps(cfg, 2)
    url = str(tmp_path / "ckpt")
    case = [("r", "context_fsdp_resume_case", (cfg, url))]
    out = C.spawn(2, case, port=29985, timeout_s=200)["r"]
    for res in out.values():
        assert res["version"] == 2
        assert res["first"]["grad_norm"] == pytest.approx(ref[0]["grad_norm"], abs=TOL)
        assert res["metrics"]["grad_norm"] == pytest.approx(ref[1]["grad_norm"], abs=1e-4)
    for k in ("pg_loss", "kl", "entropy"):
        mean = (out[0]["metrics"][k] + out[1]["metrics"][k]) / 2
        assert mean == pytest.approx(ref[1][k], abs=1e-4), k
