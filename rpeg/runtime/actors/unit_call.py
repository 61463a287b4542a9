"""What a rank is handed to run one execution unit (``RankActor.run_unit``): the compiled
unit itself (stages, kinds, micro-batch size, token budget, streaming chunk) and the
per-rank inputs the driver adds. Typed data across the process boundary: no positional
tuples, no dicts."""

from __future__ import annotations

from dataclasses import dataclass

from rpeg.compile.step import TaskSpec
from rpeg.runtime.data import PromptShard


@dataclass(frozen=True)
class UnitCall:
    """One unit on one rank. ``prompts``: the rank's prompts of the step (a unit that
    generates; tp replicas share their dp index's). ``stream_from``: the Dask actor handle of
    the generator rank whose streamed chunks this rank consumes (streaming across groups)."""

    unit: TaskSpec
    prompts: PromptShard | None = None
    stream_from: object | None = None

    def __post_init__(self) -> None:
        if self.prompts is not None and not isinstance(self.prompts, PromptShard):
            raise TypeError(
                f"UnitCall.prompts must be a PromptShard (row_shards.prompt_shards), "
                f"got {type(self.prompts).__name__}"
            )
