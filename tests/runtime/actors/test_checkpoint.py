"""Atomic fsspec checkpoints: round trip, keep_last, partial and corrupt ones skipped."""

from __future__ import annotations

import uuid

import pytest
import torch

from rpeg.errors import ConfigError
from rpeg.runtime.actors.checkpoint import COMMIT, CheckpointStore, check_writable, dumps, loads
from rpeg.runtime.actors.weight_sync import pack, total_bytes, unpack


@pytest.fixture(params=["local", "memory"])
def url(request, tmp_path):
    return (
        str(tmp_path / "ck") if request.param == "local" else f"memory://rpeg-{uuid.uuid4().hex}/ck"
    )


def test_round_trip_and_keep_last(url):
    st = CheckpointStore(url, keep_last=2)
    state = {"w": torch.randn(3, 3, dtype=torch.bfloat16), "rng": torch.get_rng_state(), "step": 3}
    for s in (1, 2, 3):
        st.save(
            s, {"rank0.pt": dumps(state), "driver.pt": dumps({"step": s})}, {"policy_version": s}
        )
    assert st.complete_steps() == [2, 3]
    meta, parts = st.latest()
    assert meta["step"] == 3 and meta["policy_version"] == 3
    back = loads(parts["rank0.pt"])
    assert torch.equal(back["w"], state["w"]) and back["w"].dtype == torch.bfloat16


def test_partial_and_corrupt_checkpoints_fall_back(url):
    st = CheckpointStore(url, keep_last=5)
    st.save(1, {"a.pt": b"one"})
    st.save(2, {"a.pt": b"two"})
    # a partial one (writer died before the commit marker)
    st.fs.makedirs(f"{st.root}/step-00000003", exist_ok=True)
    with st.fs.open(f"{st.root}/step-00000003/a.pt", "wb") as fh:
        fh.write(b"partial")
    assert st.latest()[0]["step"] == 2
    # corrupt step 2's part: checksum mismatch -> warning, previous one used
    with st.fs.open(f"{st.root}/step-00000002/a.pt", "wb") as fh:
        fh.write(b"tw0")
    with pytest.warns(RuntimeWarning, match="checksum"):
        meta, parts = st.latest()
    assert meta["step"] == 1 and parts["a.pt"] == b"one"
    assert st.fs.exists(f"{st.root}/step-00000001/{COMMIT}")


def test_unwritable_url_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not writable"):
        check_writable(str(f / "sub"))
    check_writable(str(tmp_path / "ok"))


def test_bucketed_weights_are_bit_exact():
    ts = {f"p{i}": torch.randn(100 + i) for i in range(10)}
    ts["h"] = torch.randn(7, dtype=torch.bfloat16)
    buckets = pack(ts, bucket_bytes=1024)
    assert len(buckets) > 2 and total_bytes(buckets) == sum(
        t.numel() * t.element_size() for t in ts.values()
    )
    back = unpack(buckets)
    assert all(torch.equal(back[k], ts[k]) for k in ts)
