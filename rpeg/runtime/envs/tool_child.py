"""The tool process (``python -m rpeg.runtime.envs.tool_child MEMORY_BYTES``): runs registered
tools by name under memory and CPU limits; see :mod:`rpeg.runtime.envs.tool_sandbox`."""

from __future__ import annotations

import json
import os
import resource
import sys


def _vm_bytes() -> int:
    """This process's address-space size (``VmSize``), 0 where /proc does not say."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _answer(req: dict) -> dict:
    from rpeg.runtime.envs.calculator import CalcError
    from rpeg.runtime.envs.tools import TOOLS

    tool = TOOLS.get(req.get("tool"))
    if tool is None:
        return {"error": f"KeyError: no tool {req.get('tool')!r} is registered"}
    try:
        result = tool.fn(req.get("argument"))
    except CalcError as exc:
        return {"refused": str(exc)}
    except MemoryError:
        return {"error": "MemoryError: the tool went over its memory limit"}
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the caller counts it
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    if not isinstance(result, str):
        return {"error": f"BadToolResult: returned {type(result).__name__}, not text"}
    return {"result": result}


def _main() -> None:  # pragma: no cover - runs in the child process
    from rpeg.runtime.envs import tools  # noqa: F401 - imported before the limits are set

    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a tool's prints go to stderr, not the protocol
    extra = int(sys.argv[1]) if len(sys.argv) > 1 else 256 * 2**20
    base = _vm_bytes()
    if base:
        resource.setrlimit(resource.RLIMIT_AS, (base + extra, base + extra))
    proto.write('{"ready": true}\n')
    for raw in sys.stdin:
        req = json.loads(raw)
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu = int(used.ru_utime + used.ru_stime) + int(req.get("cpu_s", 10)) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, resource.RLIM_INFINITY))
        proto.write(json.dumps(_answer(req)) + "\n")


if __name__ == "__main__":  # pragma: no cover
    _main()
