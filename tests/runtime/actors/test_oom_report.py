"""A CUDA out-of-memory error is reported with the unit and the plan's predicted memory, and
is never retried as a lost worker -- also when CUDA reports it as a plain RuntimeError (a
cuBLAS workspace, NCCL's buffers: "Cuda failure 'out of memory'"), which used to be an
unknown error, or a lost peer when NCCL's abort message came with it."""

from __future__ import annotations

import pytest

from rpeg.config import RunConfig
from rpeg.runtime.actors.failures import classify, first_cause
from rpeg.runtime.actors.predicted import unit_memory_gib
from rpeg.runtime.step import messages as M
from tests.runtime.actors.test_scheduler import SYNC_DP, Sim, make

NCCL_OOM = (
    "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO "
    "for details), NCCL version 2.27.3\nncclUnhandledCudaError: Call to CUDA function failed."
    "\nLast error:\nCuda failure 'out of memory'"
)


@pytest.mark.parametrize(
    "text",
    [
        NCCL_OOM,
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        NCCL_OOM + "\nNCCL communicator was aborted on rank 1",  # with a lost-peer phrase
    ],
)
def test_cuda_allocation_failures_are_out_of_memory(text):
    assert classify(RuntimeError(text)) == "oom"


def test_the_oom_rank_is_the_cause_not_its_peer_whose_collective_broke():
    peer = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error")
    assert first_cause([peer, RuntimeError(NCCL_OOM)]).args[0] == NCCL_OOM


def test_the_report_names_the_unit_and_its_predicted_memory_and_is_not_retried():
    s = make(SYNC_DP, 3, checkpoint_every=1, max_recoveries=5)
    s.predicted_memory_gib = {"train_actor": 61.25, "generate": 20.0}
    sim = Sim(s, "fifo")

    def fail(ins):
        if isinstance(ins, M.RunUnit) and ins.unit == "train_actor" and ins.step == 1:
            return M.OutOfMemory(ins, RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
        return None

    sim.run(fail=fail)
    assert isinstance(sim.outcome, M.Fail) and sim.outcome.kind == "oom"
    reason = sim.outcome.reason
    assert "'train_actor' of step 1 ran out of memory" in reason
    assert "the plan predicted 61.25 GiB per device for train_actor" in reason
    assert "generate" not in reason and sim.s.recoveries == 0


def test_predicted_unit_memory_comes_from_the_performance_model():
    got = unit_memory_gib(RunConfig())
    assert got["train_actor"] > 0 and all(v >= 0 for v in got.values()), got
