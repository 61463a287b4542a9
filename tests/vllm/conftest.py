"""Tests against the real vLLM: they run in the vLLM environment (``bash scripts/vllm_env.sh
DIR``; ``.ci/run`` builds it at ``$RPEG_VLLM_ENV``, default ``~/.cache/rpeg-vllm-env``, and
runs ``PREFECT_HOME=DIR/prefect-home DIR/bin/python -m pytest tests/vllm``).

In any other Python (the main environment has no vLLM: its pins clash with prefect's) the
files here are not collected at all, so ``pytest`` there neither imports nor skips them one by
one. Engines are expensive (one ``vllm.LLM`` takes 20-100 s to start on the 2-core CI machine),
so the fixtures build as few as the tests need: ``untied_engine`` is one for the session.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

# (this folder is itself a namespace package "vllm" once tests/ is on sys.path: real vLLM has
# an origin, its __init__.py)
_spec = importlib.util.find_spec("vllm")
collect_ignore_glob = [] if _spec is not None and _spec.origin else ["test_*.py"]

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB (the default fraction fails here)
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


@pytest.fixture(scope="session", autouse=True)
def _threads():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def untied_engine():
    """``(model, tokenizer, engine)``: one vLLM engine, fresh on the untied tiny model of seed
    0 (W0), shared by the test modules (an engine start is 20-100 s here). A test that loads
    other weights puts W0 back, at ``policy_version`` 0, before it ends."""
    from tiny_engines import engine_of, tiny

    model, tok = tiny(tied=False, seed=0)
    eng = engine_of(model, tok)
    yield model, tok, eng
    eng.shutdown()
