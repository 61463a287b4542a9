"""The base of every run-config section: typed, no unknown keys, finite numbers only."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every config section: typed, no unknown keys, validated on assignment, finite
    numbers only (``lr: .inf`` or ``nan`` is refused: it only ever produces NaN weights)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False
    )
