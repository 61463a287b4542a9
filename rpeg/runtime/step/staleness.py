"""Bounded-staleness buffer between rollout and training.

:class:`StalenessState` is a **pure** state machine, ``handle(event) -> [instruction]``; no
threads, no clocks, no I/O. The step scheduler (:mod:`rpeg.runtime.step.scheduler`) owns
one and feeds it from the events of the run; every property test drives it directly.
Nothing blocks on the buffer: the scheduler only asks for what it knows is there.

Model. Samples are numbered in the order generation is *admitted* (``index``); the samples
of training step ``s`` are the slot ``[s*B, (s+1)*B)`` (``B`` = samples per step). Policy
version ``v`` = number of trainer updates published; step ``s`` trains at version ``s``.
A generator holding weights of version ``g`` may generate samples of slot ``s`` only if
``s - g <= k``: so generation runs ahead of training by at most ``k`` versions, and the
trainer at version ``v`` never sees a sample older than ``v - k``. ``k = 0`` is synchronous
on-policy. Samples with ``version < v`` are delivered with ``lag > 0`` so the trainer
applies the off-policy correction (``algorithm.rollout_correction``); the trainer checks the
lag again before every optimizer update, per mini-batch (rpeg.runtime.algorithms.lags), and
counts it per step (``staleness_lag_<i>``). Delivery is by slot, so no sample is used twice,
none is skipped, and none is lost (admitted-but-unproduced samples survive a checkpoint as
reservations to reissue).

Events (inputs):           Instructions (outputs):
  ``GeneratorSynced(g)``     ``Admit(start, count, version)``   generate these indices now
  ``Publish(v)``             ``Block(count, version, needed)``  wait for a newer version
  ``RequestSlot(g, count)``  ``Deliver(step, samples, lags)``   the batch for ``step``
  ``Produced(samples)``      ``Wait(step, missing)``            batch not complete yet
  ``Take(v)``                ``Stalled(reason)``                can never complete: livelock
                             ``Reject(reason)``                 a protocol violation
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rpeg.errors import RpegError

# --------------------------------------------------------------------------- the rule


def within_bound(step: int, version: int, k: int) -> bool:
    """The one staleness rule of both runtimes: samples for training step ``step`` (trained
    at policy version ``step``) may be generated with weights of ``version`` iff
    ``step - version <= k``. A generator refreshes its weights when the next step it
    generates for is not within the bound (rpeg.runtime.actors.weight_sync.refresh_lagging_engine)."""
    return step - version <= k


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Sample:
    """One generated sample: its admission index, the policy version that produced it, and
    an opaque payload (the runtime stores a per-sample slice or a reference)."""

    index: int
    version: int
    payload: Any = None


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class GeneratorSynced:
    """The generators now hold weights of ``version``."""

    version: int


@dataclass(frozen=True)
class Publish:
    """The trainer finished an update; its weights are now ``version``."""

    version: int


@dataclass(frozen=True)
class RequestSlot:
    """A generator holding ``version`` asks to generate ``count`` more samples."""

    version: int
    count: int


@dataclass(frozen=True)
class Produced:
    """Admitted samples are done."""

    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class Take:
    """The trainer at ``version`` wants the batch of step ``version``."""

    version: int


Event = GeneratorSynced | Publish | RequestSlot | Produced | Take

# --------------------------------------------------------------------------- instructions


@dataclass(frozen=True)
class Admit:
    start: int
    count: int
    version: int


@dataclass(frozen=True)
class Block:
    count: int
    version: int
    needed_version: int


@dataclass(frozen=True)
class Deliver:
    step: int
    samples: tuple[Sample, ...]
    lags: tuple[int, ...]


@dataclass(frozen=True)
class Wait:
    step: int
    missing: int


@dataclass(frozen=True)
class Stalled:
    reason: str


@dataclass(frozen=True)
class Reject:
    reason: str


Instruction = Admit | Block | Deliver | Wait | Stalled | Reject


class StalenessError(RpegError):
    """A protocol violation of the staleness buffer."""


# --------------------------------------------------------------------------- state machine


@dataclass
class StalenessState:
    """The pure state machine. ``k`` = max staleness, ``batch_size`` = samples per step."""

    k: int
    batch_size: int
    trainer_version: int = 0
    generator_version: int = 0
    next_index: int = 0  # next admission index
    next_step: int = 0  # next step to deliver
    ready: dict[int, Sample] = field(default_factory=dict)  # produced, not delivered
    reserved: set[int] = field(default_factory=set)  # admitted, not produced
    reissue: list[int] = field(default_factory=list)  # reservations lost with a restart
    reserved_version: dict[int, int] = field(default_factory=dict)
    delivered: int = 0

    def __post_init__(self) -> None:
        if self.k < 0 or self.batch_size < 1:
            raise StalenessError(
                f"need k >= 0 and batch_size >= 1 (got {self.k}, {self.batch_size})"
            )

    # ---------------------------------------------------------------- helpers
    def step_of(self, index: int) -> int:
        return index // self.batch_size

    def max_admissible_index(self, version: int) -> int:
        """Largest index a generator at ``version`` may produce (exclusive bound)."""
        return (version + self.k + 1) * self.batch_size

    # ---------------------------------------------------------------- transitions
    def handle(self, event: Event) -> list[Instruction]:
        if isinstance(event, GeneratorSynced):
            return self._synced(event)
        if isinstance(event, Publish):
            return self._publish(event)
        if isinstance(event, RequestSlot):
            return self._request(event)
        if isinstance(event, Produced):
            return self._produced(event)
        if isinstance(event, Take):
            return self._take(event)
        return [Reject(f"unknown event {event!r}")]

    def _synced(self, ev: GeneratorSynced) -> list[Instruction]:
        if ev.version > self.trainer_version:
            return [
                Reject(f"generator synced to version {ev.version} > trainer {self.trainer_version}")
            ]
        if ev.version < self.generator_version:
            return [Reject(f"generator version went back {self.generator_version} -> {ev.version}")]
        self.generator_version = ev.version
        return []

    def _publish(self, ev: Publish) -> list[Instruction]:
        if ev.version != self.trainer_version + 1:
            return [
                Reject(f"publish {ev.version} after {self.trainer_version}: versions advance by 1")
            ]
        if ev.version > self.next_step:
            return [
                Reject(f"publish {ev.version} before the batch of step {self.next_step} was taken")
            ]
        self.trainer_version = ev.version
        return []

    def _request(self, ev: RequestSlot) -> list[Instruction]:
        if ev.count < 1:
            return [Reject(f"count must be >= 1 (got {ev.count})")]
        if ev.version > self.trainer_version:
            return [Reject(f"generator version {ev.version} > trainer {self.trainer_version}")]
        if not within_bound(self.trainer_version, ev.version, self.k):
            # would only produce samples that are already too stale for the trainer
            return [Block(ev.count, ev.version, self.trainer_version - self.k)]
        limit = self.max_admissible_index(ev.version)
        if self.reissue:
            idx = sorted(self.reissue)[: ev.count]
            if max(idx) >= limit:
                return [Block(ev.count, ev.version, self.step_of(max(idx)) - self.k)]
            # reissued indices must be contiguous to describe them as one Admit
            run = [idx[0]]
            for i in idx[1:]:
                if i != run[-1] + 1:
                    break
                run.append(i)
            for i in run:
                self.reissue.remove(i)
                self.reserved.add(i)
                self.reserved_version[i] = ev.version
            return [Admit(run[0], len(run), ev.version)]
        end = self.next_index + ev.count
        if end > limit:
            needed = self.step_of(end - 1) - self.k
            return [Block(ev.count, ev.version, needed)]
        start = self.next_index
        for i in range(start, end):
            self.reserved.add(i)
            self.reserved_version[i] = ev.version
        self.next_index = end
        return [Admit(start, ev.count, ev.version)]

    def _produced(self, ev: Produced) -> list[Instruction]:
        out: list[Instruction] = []
        for s in ev.samples:
            if s.index not in self.reserved:
                out.append(Reject(f"sample {s.index} was not admitted (or was produced twice)"))
                continue
            if s.version != self.reserved_version[s.index]:
                out.append(
                    Reject(
                        f"sample {s.index} carries version {s.version}, admitted at "
                        f"{self.reserved_version[s.index]}"
                    )
                )
                continue
            self.reserved.discard(s.index)
            del self.reserved_version[s.index]
            self.ready[s.index] = s
        return out

    def _take(self, ev: Take) -> list[Instruction]:
        if ev.version != self.trainer_version or ev.version != self.next_step:
            return [
                Reject(
                    f"take at version {ev.version}: trainer is at {self.trainer_version}, "
                    f"next step to deliver is {self.next_step}"
                )
            ]
        step = self.next_step
        lo, hi = step * self.batch_size, (step + 1) * self.batch_size
        missing = [i for i in range(lo, hi) if i not in self.ready]
        if missing:
            unadmitted = [i for i in missing if i not in self.reserved]
            if unadmitted and not within_bound(step, self.generator_version, self.k):
                return [
                    Stalled(
                        f"step {step} needs samples generated with policy version >= "
                        f"{step - self.k} (max_staleness k={self.k}), but the generators hold "
                        f"version {self.generator_version} and the trainer is at "
                        f"{self.trainer_version}: sync weights to the generators"
                    )
                ]
            return [Wait(step, len(missing))]
        samples = tuple(self.ready.pop(i) for i in range(lo, hi))
        lags = tuple(self.trainer_version - s.version for s in samples)
        assert all(lag >= 0 and within_bound(lag, 0, self.k) for lag in lags), (lags, self.k)
        self.next_step += 1
        self.delivered += len(samples)
        return [Deliver(step, samples, lags)]

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Everything in flight: produced samples (with payloads) and reservations; the
        reservations become ``reissue`` on restore (their generator is gone)."""
        return {
            "k": self.k,
            "batch_size": self.batch_size,
            "trainer_version": self.trainer_version,
            "generator_version": self.generator_version,
            "next_index": self.next_index,
            "next_step": self.next_step,
            "delivered": self.delivered,
            "ready": [
                (s.index, s.version, s.payload)
                for s in sorted(self.ready.values(), key=lambda s: s.index)
            ],
            "reissue": sorted(set(self.reissue) | self.reserved),
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any], *, k: int | None = None) -> StalenessState:
        st = cls(k=d["k"] if k is None else k, batch_size=d["batch_size"])
        st.trainer_version = d["trainer_version"]
        # generators restart from the trainer's checkpointed weights (sync at start)
        st.generator_version = d["generator_version"]
        st.next_index = d["next_index"]
        st.next_step = d["next_step"]
        st.delivered = d["delivered"]
        st.ready = {i: Sample(i, v, p) for i, v, p in d["ready"]}
        st.reissue = list(d["reissue"])
        return st
