"""A state file that is data only: tensors in safetensors, everything else as a JSON tree.

Checkpoint parts (rank weights, optimizer and RNG states, the driver's cursor, buffer and
metrics, the local trainer's state) used to be ``torch.save`` pickles loaded as full
pickles: a crafted file with a matching ``COMMIT.json`` ran code on ``--resume``. :func:`dumps` now writes one safetensors file whose tensors are the state's
tensors and whose metadata holds the rest of the state as JSON; :func:`loads` parses it with
safetensors (no pickle) and rebuilds the tree.

The tree admits: ``None``, ``bool``, ``int``, ``float`` (non-finite ones tagged), ``str``,
``bytes``, lists, tuples, dicts with any of these as keys, tensors, ``torch.dtype``,
``torch.Size``, numpy arrays (stored as tensors) and dataclasses defined in
``rpeg.runtime`` modules (rollout batches, examples, buffer samples). A dataclass is rebuilt
by setting its fields on a bare instance (``object.__new__``): no ``__init__``,
``__post_init__`` or ``__setstate__`` runs, and a class outside ``rpeg.runtime.`` or one that
is not a dataclass is refused.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import json
import math
from typing import Any

MAGIC = "rpeg-state"
VERSION = 1
_TREE = "rpeg_tree"
#: the only modules whose dataclasses a state file may name (and so import on load)
_DATACLASS_PREFIX = "rpeg.runtime."


class StateFileError(ValueError):
    """Not an rpeg state file, or one that holds something other than data."""


def dumps(obj: Any) -> bytes:
    """Serialize ``obj`` (see the module doc for what it may hold) to bytes."""
    from safetensors.torch import save

    tensors: dict[str, Any] = {}
    tree = _enc(obj, tensors)
    meta = {"format": MAGIC, "version": str(VERSION), _TREE: json.dumps(tree)}
    return save(tensors, metadata=meta)


def loads(data: bytes) -> Any:
    """Parse bytes written by :func:`dumps`; raise :class:`StateFileError` for anything else
    (a pickle, a truncated file, a tree naming a class outside ``rpeg``)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    meta = header_metadata(data)
    if meta.get("format") != MAGIC or _TREE not in meta:
        raise StateFileError("not an rpeg state file (no rpeg-state metadata)")
    try:
        tensors = load(bytes(data))
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise StateFileError(f"unreadable tensors: {exc}") from None
    try:
        tree = json.loads(meta[_TREE])
    except ValueError as exc:
        raise StateFileError(f"unreadable state tree: {exc}") from None
    return _dec(tree, tensors)


def header_metadata(data: bytes) -> dict[str, str]:
    """The safetensors header's ``__metadata__`` (JSON only, nothing executed)."""
    if len(data) < 8:
        raise StateFileError("not a safetensors file (too short)")
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data) or n > 1 << 30:
        raise StateFileError("not a safetensors file (bad header length)")
    try:
        header = json.loads(bytes(data[8 : 8 + n]))
    except ValueError:
        raise StateFileError("not a safetensors file (header is not JSON)") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


# ------------------------------------------------------------------------------ encoding
def _enc(x: Any, ts: dict[str, Any]) -> Any:
    import torch

    if x is None or isinstance(x, bool | str):
        return x
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else {"__float__": repr(x)}
    if isinstance(x, torch.Tensor):
        name = f"t{len(ts)}"
        # own, contiguous, CPU memory: safetensors refuses shared storage (tied weights)
        ts[name] = x.detach().to("cpu").contiguous().clone()
        return {"__tensor__": name}
    if isinstance(x, torch.dtype):
        return {"__dtype__": str(x).removeprefix("torch.")}
    if isinstance(x, torch.Size):
        return {"__size__": list(x)}
    if isinstance(x, bytes | bytearray):
        return {"__bytes__": base64.b64encode(bytes(x)).decode()}
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return {"__tuple__": [_enc(v, ts) for v in x]}
    if isinstance(x, list):
        return [_enc(v, ts) for v in x]
    if isinstance(x, dict):
        return {"__dict__": [[_enc(k, ts), _enc(v, ts)] for k, v in x.items()]}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        cls = type(x)
        if not cls.__module__.startswith(_DATACLASS_PREFIX):
            raise TypeError(
                f"state files hold {_DATACLASS_PREFIX}* dataclasses only, not "
                f"{cls.__module__}.{cls.__qualname__}"
            )
        return {
            "__dataclass__": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {f.name: _enc(getattr(x, f.name), ts) for f in dataclasses.fields(x)},
        }
    if type(x).__module__ == "numpy":
        return _enc_numpy(x, ts)
    raise TypeError(f"cannot store {type(x).__name__} in a state file (data only)")


def _enc_numpy(x: Any, ts: dict[str, Any]) -> Any:
    import numpy as np
    import torch

    if isinstance(x, np.ndarray):
        name = f"t{len(ts)}"
        ts[name] = torch.from_numpy(np.ascontiguousarray(x)).clone()
        return {"__ndarray__": name}
    if isinstance(x, np.generic):
        return _enc(x.item(), ts)
    raise TypeError(f"cannot store {type(x).__name__} in a state file (data only)")


# ------------------------------------------------------------------------------ decoding
def _dec(x: Any, ts: dict[str, Any]) -> Any:
    if isinstance(x, list):
        return [_dec(v, ts) for v in x]
    if not isinstance(x, dict):
        return x
    if len(x) == 1:
        ((tag, v),) = x.items()
        if tag == "__tensor__":
            return _tensor(ts, v)
        if tag == "__ndarray__":
            return _tensor(ts, v).numpy()
        if tag == "__float__":
            if v not in ("nan", "inf", "-inf"):
                raise StateFileError(f"bad float {v!r}")
            return float(v)
        if tag == "__dtype__":
            import torch

            dt = getattr(torch, str(v), None)
            if not isinstance(dt, torch.dtype):
                raise StateFileError(f"unknown dtype {v!r}")
            return dt
        if tag == "__size__":
            import torch

            return torch.Size([int(i) for i in v])
        if tag == "__bytes__":
            return base64.b64decode(v)
        if tag == "__tuple__":
            return tuple(_dec(e, ts) for e in v)
        if tag == "__dict__":
            return {_key(_dec(k, ts)): _dec(e, ts) for k, e in v}
    if set(x) == {"__dataclass__", "fields"}:
        return _dataclass(x["__dataclass__"], {k: _dec(v, ts) for k, v in x["fields"].items()})
    raise StateFileError(f"unknown entry in state tree: {sorted(x)[:3]}")


def _key(k: Any) -> Any:
    if isinstance(k, list):  # lists are not hashable; tuples are
        raise StateFileError("a list as a dict key")
    return k


def _tensor(ts: dict[str, Any], name: Any) -> Any:
    if name not in ts:
        raise StateFileError(f"tensor {name!r} missing from the file")
    return ts[name]


#: modules whose dataclasses state files of earlier versions name, and where they live now
MOVED_MODULES = {
    f"rpeg.runtime.actors.{old}": f"rpeg.runtime.step.{new}"
    for old, new in (
        ("scheduler", "scheduler"),
        ("scheduler_invariants", "invariants"),
        ("staleness", "staleness"),
        ("recovery", "recovery"),
        ("step_messages", "messages"),
        ("step_plan", "plan"),
        ("regeneration", "regeneration"),
    )
}


def _dataclass(ref: str, fields: dict[str, Any]) -> Any:
    mod, _, qual = str(ref).partition(":")
    mod = MOVED_MODULES.get(mod, mod)
    if not mod.startswith(_DATACLASS_PREFIX) or not qual:
        raise StateFileError(
            f"refusing class {ref!r}: state files hold {_DATACLASS_PREFIX}* dataclasses only"
        )
    try:
        obj: Any = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise StateFileError(f"unknown class {ref!r}") from None
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise StateFileError(f"refusing {ref!r}: not a dataclass")
    known = {f.name for f in dataclasses.fields(obj)}
    if set(fields) - known:
        raise StateFileError(f"{ref}: unknown fields {sorted(set(fields) - known)}")
    inst = object.__new__(obj)
    for f in dataclasses.fields(obj):
        if f.name in fields:
            v = fields[f.name]
        elif f.default is not dataclasses.MISSING:
            v = f.default
        elif f.default_factory is not dataclasses.MISSING:
            v = f.default_factory()
        else:
            raise StateFileError(f"{ref}: field {f.name!r} missing")
        object.__setattr__(inst, f.name, v)
    return inst
