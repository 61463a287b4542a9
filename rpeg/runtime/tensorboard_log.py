"""TensorBoard scalars of a run, the same from both runtimes: ``<output_dir>/tb``, one point
per step at the step number the console prints (1, 2, ...), every numeric metric of the
step's ``metrics.jsonl`` line. ``tensorboard`` is a dependency; without it (a trimmed
install) nothing is written and nothing fails."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

TB_DIR = "tb"


class ScalarLog:
    def __init__(self, out: str | Path):
        self.writer = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(out) / TB_DIR))
        except Exception:  # noqa: BLE001 -- tensorboard missing: no event file
            self.writer = None

    def add(self, step: int, metrics: Mapping[str, Any]) -> None:
        """``step``: 1-based, as the console counts."""
        if self.writer is None:
            return
        for k, v in metrics.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and k != "step":
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
