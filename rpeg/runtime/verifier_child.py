"""The verifier pool's child process: reads requests on stdin, resolves the reward by its
registered name (importing the module that registers it), runs it on this process's main
thread and answers one JSON line per sample (see :mod:`rpeg.runtime.verifier`). A module of
its own so that the pool does not import the reward registry (and the registry can use the
pool)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from rpeg.runtime.verifier import NOT_REGISTERED, call_reward


def _resolve(spec: dict[str, Any]) -> Callable[..., Any]:
    import importlib

    from rpeg.runtime import rewards

    sys.path += [p for p in spec.get("path", []) if p not in sys.path]
    why = ""
    for mod in [*spec.get("modules", []), spec.get("module") or ""]:
        if mod and mod != "__main__" and mod != rewards.__name__:
            try:
                importlib.import_module(mod)  # registers the rewards it defines (once: cached)
            except ImportError as exc:  # a module the parent loaded from a file path
                why = f" (importing {mod!r}: {exc})"
    if spec["name"] in rewards.registered_rewards():
        return rewards.get_reward(spec["name"])
    raise LookupError(
        f"reward {spec['name']!r} {NOT_REGISTERED}{why}; register it in an importable module "
        "(not __main__) to run it there"
    )


def _main() -> None:  # pragma: no cover - runs in the child process
    # results go to a private copy of stdout; anything a reward prints goes to stderr
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    for raw in sys.stdin:  # one request per sample: {"fn": spec, "item": [p, r, a]}
        req = json.loads(raw)
        try:
            fn = _resolve(req["fn"])
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - an import that exits too
            fn = None
            err = f"{type(exc).__name__}: {exc}"
        proto.write(json.dumps({"ready": True}) + "\n")
        p, r, a = req["item"]
        res = call_reward(fn, p, r, a) if fn is not None else (None, err)
        proto.write(json.dumps(list(res)) + "\n")


if __name__ == "__main__":  # pragma: no cover
    _main()
