"""The local trainer runs the run's compiled step (rpeg.compile.compile_local): its units in
order, each unit's micro-batch size from the plan (not the config's), and its k."""

from __future__ import annotations

from rpeg.config import RunConfig

UNITS = ("generate", "reward", "ref_logprob", "old_logprob", "advantage", "train_actor")


def _cfg(ref_mbs: int, k: int = 0, packing: bool | str = False) -> RunConfig:
    units = {u: {"devices": "0"} for u in (*UNITS, "sync_weights")}
    units["ref_logprob"]["micro_batch_size"] = ref_mbs
    units["ref_logprob"]["seq_packing"] = packing
    for u in ("old_logprob", "train_actor"):
        units[u]["micro_batch_size"] = 16
    return RunConfig().with_overrides(
        {
            "optim.warmup_sft_steps": 0,
            "workload.num_prompts": 4,
            "workload.samples_per_prompt": 4,
            "workload.max_response_tokens": 4,
            "workload.micro_batch_size": 16,  # the config's: one call for the 16 samples
            "runtime.max_staleness": k,
            "cluster.n_workers": 1,
            "cluster.num_devices": 1,
            "plan": {
                "cluster": "local-cpu",
                "model": "rpeg-tiny",
                "staleness": k,
                "graph": {"builder": None},
                "units": units,
            },
        }
    )


def test_the_local_trainer_runs_each_unit_at_its_planned_micro_batch_size():
    """16 samples: the reference's forward runs 16 / 4 = 4 times at the plan's 4 (the config
    says 16: once)."""
    from rpeg.runtime.local_trainer import LocalTrainer

    tr = LocalTrainer(_cfg(ref_mbs=4))
    assert tr.compiled.task("ref_logprob").micro_batch_size == 4
    assert tr.compiled.task("train_actor").micro_batch_size == 16
    assert [str(k) for k in tr.stage_kinds()] == [*UNITS, "sync_weights"]
    calls = []
    decoder = getattr(tr.reference.module, "model", tr.reference.module)
    decoder.register_forward_pre_hook(lambda *_a: calls.append(1))
    tr.step()
    assert len(calls) == 4
    tr.close()


def test_a_packed_unit_runs_its_rows_end_to_end_within_its_token_budget():
    """seq_packing: the reference's micro-batches hold at most 4 x (32-token prompt cap +
    4-token response cap) = 144 real tokens, each run as one row without padding: 16 rows of
    at most 36 tokens take 2 to 4 forwards, not the 4 of 4 rows each."""
    from rpeg.runtime.local_trainer import LocalTrainer

    tr = LocalTrainer(_cfg(ref_mbs=4, packing=True))
    unit = tr.compiled.task("ref_logprob")
    assert unit.seq_packing and unit.max_tokens_per_micro_batch == 4 * (32 + 4)
    assert not tr.compiled.task("generate").seq_packing  # no forward pass to pack
    shapes = []
    decoder = getattr(tr.reference.module, "model", tr.reference.module)
    decoder.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    tr.step()
    assert all(rows == 1 and n <= 144 for rows, n in shapes)
    assert 2 <= len(shapes) < 4
    tr.close()


def test_the_local_trainer_takes_k_from_its_compiled_step():
    from rpeg.runtime.local_trainer import LocalTrainer

    tr = LocalTrainer(_cfg(ref_mbs=4, k=1))
    assert tr.k == tr.compiled.staleness == 1
    tr.close()
