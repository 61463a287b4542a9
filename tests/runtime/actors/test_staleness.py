"""The bounded-staleness buffer: a pure state machine, driven by random interleavings."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpeg.runtime.step.staleness import (
    Admit,
    Block,
    Deliver,
    GeneratorSynced,
    Produced,
    Publish,
    Reject,
    RequestSlot,
    Sample,
    StalenessState,
    Stalled,
    Take,
    Wait,
)

OPS = st.sampled_from(["sync", "request", "produce", "take", "publish", "checkpoint", "crash"])


class Sim:
    """A protocol-following driver of the state machine that records what was delivered."""

    def __init__(self, k: int, b: int):
        self.st = StalenessState(k=k, batch_size=b)
        self.pending: list[tuple[int, int]] = []  # admitted (index, version)
        self.holding: Deliver | None = None  # batch the trainer is training on
        self.delivered: list[int] = []
        self.gen = 0

    def do(self, op: str, arg: int) -> None:
        st = self.st
        if op == "sync":
            self.gen = st.trainer_version - (arg % (st.trainer_version - self.gen + 1))
            self.gen = max(self.gen, st.generator_version)
            assert st.handle(GeneratorSynced(self.gen)) == []
        elif op == "request":
            (ins,) = st.handle(RequestSlot(self.gen, 1 + arg % (2 * st.batch_size)))
            assert isinstance(ins, Admit | Block), ins
            if isinstance(ins, Admit):
                # generating these samples with version gen is allowed: slot - gen <= k
                for i in range(ins.start, ins.start + ins.count):
                    assert st.step_of(i) - ins.version <= st.k
                    self.pending.append((i, ins.version))
        elif op == "produce" and self.pending:
            n = 1 + arg % len(self.pending)
            # out-of-order completion
            chosen = [self.pending.pop((arg * 7 + j) % len(self.pending)) for j in range(n)]
            out = st.handle(Produced(tuple(Sample(i, v, payload=f"s{i}") for i, v in chosen)))
            assert out == []
        elif op == "take" and self.holding is None:
            (ins,) = st.handle(Take(st.trainer_version))
            assert isinstance(ins, Deliver | Wait | Stalled), ins
            if isinstance(ins, Deliver):
                v = st.trainer_version
                assert ins.step == v
                for s, lag in zip(ins.samples, ins.lags, strict=True):
                    # the invariant: never older than k versions, never from the future
                    assert v - st.k <= s.version <= v
                    assert lag == v - s.version
                    assert s.payload == f"s{s.index}"
                self.delivered += [s.index for s in ins.samples]
                self.holding = ins
        elif op == "publish" and self.holding is not None:
            assert st.handle(Publish(st.trainer_version + 1)) == []
            self.holding = None
        elif op == "checkpoint":
            self.st = StalenessState.from_state_dict(self.st.state_dict())
            # pending generation continues across a checkpoint (no crash)
            self.st.reserved = {i for i, _ in self.pending}
            self.st.reserved_version = dict(self.pending)
            self.st.reissue = [i for i in self.st.reissue if i not in self.st.reserved]
        elif op == "crash":
            # generators die: their admitted, unproduced samples must be reissued, not lost
            self.st = StalenessState.from_state_dict(self.st.state_dict())
            self.pending = []

    def drain(self) -> None:
        """Run the protocol until every admitted sample (slot rounded up) is delivered."""
        b = self.st.batch_size
        target = -(-self.st.next_index // b) * b
        for _ in range(10_000):
            if self.holding is not None:
                self.do("publish", 0)
                continue
            st = self.st
            if len(self.delivered) >= target:
                assert not st.reserved and not st.reissue and not self.pending
                return
            self.gen = st.trainer_version
            st.handle(GeneratorSynced(self.gen))
            while st.next_index < target or st.reissue:
                ins = st.handle(RequestSlot(self.gen, 1))[0]
                if not isinstance(ins, Admit):
                    break
                self.pending.append((ins.start, ins.version))
            while self.pending:
                self.do("produce", len(self.pending) - 1)
            self.do("take", 0)
        raise AssertionError("drain did not terminate")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    k=st.integers(0, 3),
    b=st.integers(1, 4),
    ops=st.lists(st.tuples(OPS, st.integers(0, 50)), max_size=80),
)
def test_random_interleavings_keep_the_bound_and_lose_nothing(k, b, ops):
    sim = Sim(k, b)
    for op, arg in ops:
        sim.do(op, arg)
        st = sim.st
        # generation never runs ahead of training by more than k versions
        assert all(st.step_of(i) - v <= k for i, v in sim.pending)
        assert st.trainer_version - k <= st.trainer_version
    admitted = sim.st.next_index
    sim.drain()
    # every admitted sample delivered exactly once, in slot order
    assert sim.delivered == list(range(len(sim.delivered)))
    assert len(sim.delivered) >= admitted
    assert len(set(sim.delivered)) == len(sim.delivered)


def test_k0_is_synchronous():
    st = StalenessState(k=0, batch_size=2)
    assert st.handle(RequestSlot(0, 2)) == [Admit(0, 2, 0)]
    (blk,) = st.handle(RequestSlot(0, 2))
    assert isinstance(blk, Block) and blk.needed_version == 1
    st.handle(Produced((Sample(0, 0), Sample(1, 0))))
    (d,) = st.handle(Take(0))
    assert isinstance(d, Deliver) and d.lags == (0, 0)
    st.handle(Publish(1))
    st.handle(GeneratorSynced(1))
    assert st.handle(RequestSlot(1, 2)) == [Admit(2, 2, 1)]


def test_k1_runs_one_version_ahead_and_reports_lag():
    st = StalenessState(k=1, batch_size=1)
    assert st.handle(RequestSlot(0, 2)) == [Admit(0, 2, 0)]
    assert isinstance(st.handle(RequestSlot(0, 1))[0], Block)
    st.handle(Produced((Sample(0, 0), Sample(1, 0))))
    assert st.handle(Take(0))[0].lags == (0,)
    st.handle(Publish(1))
    assert st.handle(Take(1))[0].lags == (1,)  # off-policy: correct with TIS


def test_protocol_violations_are_rejected():
    st = StalenessState(k=0, batch_size=1)
    assert isinstance(st.handle(Produced((Sample(0, 0),)))[0], Reject)  # not admitted
    assert isinstance(st.handle(GeneratorSynced(3))[0], Reject)  # future version
    assert isinstance(st.handle(Publish(1))[0], Reject)  # before taking the batch
    assert isinstance(st.handle(Take(2))[0], Reject)


def test_livelock_is_detected_with_a_clear_error():
    st = StalenessState(k=0, batch_size=1)
    (adm,) = st.handle(RequestSlot(0, 1))
    st.handle(Produced((Sample(adm.start, 0),)))
    assert isinstance(st.handle(Take(0))[0], Deliver)
    st.handle(Publish(1))  # ... but never sync the generators
    (ins,) = st.handle(Take(1))
    assert isinstance(ins, Stalled) and "sync weights" in ins.reason
    assert isinstance(st.handle(RequestSlot(0, 1))[0], Block)  # version 0 too old for slot 1


def test_state_dict_round_trip_keeps_in_flight_samples():
    st = StalenessState(k=2, batch_size=2)
    st.handle(RequestSlot(0, 6))
    st.handle(Produced((Sample(0, 0, "a"), Sample(1, 0, "b"), Sample(3, 0, "d"))))
    d = st.state_dict()
    st2 = StalenessState.from_state_dict(d)
    assert st2.ready.keys() == {0, 1, 3} and st2.reissue == [2, 4, 5]
    assert st2.handle(RequestSlot(0, 1)) == [Admit(2, 1, 0)]
    assert st2.handle(RequestSlot(0, 4)) == [Admit(4, 2, 0)]
