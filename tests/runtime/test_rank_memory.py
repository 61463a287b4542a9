"""Each rank's predicted peak memory (rpeg.perf.rank_memory via rpeg.compile.memory) and the
refusal before start of a plan whose ranks would not fit their workers' memory."""

from __future__ import annotations

import pytest

from rpeg.config import RunConfig
from rpeg.errors import ConfigError

# issue 38's model: 302M parameters, its unsharded training state 20 B/param = 6.04 GB
SHAPE = {
    "hidden_size": 1536,
    "intermediate_size": 6144,
    "num_hidden_layers": 8,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
}
UNITS = ("generate", "reward", "ref_logprob", "old_logprob", "advantage", "train_actor")


def _cfg(dp: int, worker_memory: str = "auto", engine: str = "fsdp") -> RunConfig:
    devs = f"0-{dp - 1}" if dp > 1 else "0"
    units = {u: {"devices": devs} for u in (*UNITS, "sync_weights")}
    units["train_actor"]["engine"] = engine
    return RunConfig().with_overrides(
        {
            "model.tiny_shape": SHAPE,
            "optim.warmup_sft_steps": 0,
            "cluster.n_workers": dp,
            "cluster.num_devices": dp,
            "cluster.worker_memory": worker_memory,
            "plan": {
                "cluster": "local-cpu",
                "model": "rpeg-tiny",
                "staleness": 0,
                "graph": {"builder": None},
                "units": units,
            },
        }
    )


def _peak(cfg):
    from rpeg.compile import compile_step
    from rpeg.compile.memory import rank_peaks

    (p,) = rank_peaks(compile_step(None, cfg), cfg)
    return p


def test_the_wide_built_in_model_is_priced_at_its_shape():
    from rpeg.specs.hf import tiny_model

    spec = tiny_model(SHAPE)
    emb = 100 * 1536  # vocab 100, tied
    block = 4 * 1536 * 1536 + 3 * 1536 * 6144 + 2 * 1536  # attention, MLP, two norms
    assert spec.params == emb + 8 * block + 1536  # + the final norm
    assert _peak(_cfg(2)).parts["actor_weights"] == pytest.approx(4 * spec.params / 2 / 1e9)


def test_fsdp_shards_each_ranks_state_and_a_third_less_again_at_dp4():
    """Resident state per rank: fp32 masters + AdamW moments (12 B/param) and the fp32
    reference (4 B/param), over dp under FSDP; replicas hold all of it."""
    from rpeg.specs.hf import tiny_model

    P = tiny_model(SHAPE).params
    one, two, four = (_peak(_cfg(dp)) for dp in (1, 2, 4))
    for p, dp in ((one, 1), (two, 2), (four, 4)):
        state = p.parts["actor_weights"] + p.parts["actor_optimizer"] + p.parts["reference"]
        assert state == pytest.approx(16 * P / dp / 1e9)
    assert two.peak_gb < 0.7 * one.peak_gb  # the process and its channel do not shrink
    assert four.peak_gb < (1 - 1 / 3) * two.peak_gb
    replicas = _peak(_cfg(2, engine="auto"))
    assert replicas.parts["actor_weights"] == pytest.approx(one.parts["actor_weights"])


def test_a_rank_over_its_workers_memory_is_refused_before_start():
    """The state is 1.5x the worker's memory: dp=1 is refused naming the group, the limit
    and the parts; dp=2 with FSDP fits and passes."""
    from rpeg.preflight.before_start import preflight
    from rpeg.specs.hf import tiny_model

    limit = 20 * tiny_model(SHAPE).params / 1e9 / 1.5
    size = f"{limit:.2f}GB"
    with pytest.raises(ConfigError) as err:
        preflight(_cfg(1, size), cluster_devices=None)
    text = str(err.value)
    assert "actor group g0" in text and "cluster.worker_memory" in text
    assert f"{limit:.2f} GB" in text and "actor_optimizer" in text
    assert _peak(_cfg(2, size)).peak_gb < limit
    preflight(_cfg(2, size), cluster_devices=None)  # no memory problem


def test_worker_memory_sizes_are_read_or_refused():
    from rpeg.perf.rank_memory import parse_size_gb

    assert parse_size_gb("8GiB") == pytest.approx(8 * 2**30 / 1e9)
    assert parse_size_gb("500MB") == pytest.approx(0.5)
    assert parse_size_gb("auto") is None and parse_size_gb("0") is None
    with pytest.raises(ValueError, match="expected a size"):
        parse_size_gb("8 parsecs")
