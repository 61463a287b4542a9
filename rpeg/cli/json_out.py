"""JSON as the commands print it (``--json``): strict RFC 8259, so any parser reads it.

Python's ``json`` writes a non-finite float as ``NaN`` / ``Infinity``, which JSON does not have
(JavaScript's ``JSON.parse`` and other strict readers refuse the whole document). A figure that
does not exist -- the one-shot error of a source with a single row, a mean over no rows -- is
written ``null`` instead."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (in dicts, lists and tuples, at any depth) as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite` ``(obj)``, refusing any non-finite number left."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)
