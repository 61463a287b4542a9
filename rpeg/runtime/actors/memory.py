"""Peak resident memory of a worker process (a rank's ``memory_info``). A worker process
outlives its actors, so an actor resets the peak when it is created."""

from __future__ import annotations

import contextlib


def reset_peak_rss() -> None:
    """Reset this process's peak RSS (``VmHWM``; Linux ``clear_refs`` value 5)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def peak_rss() -> int:
    """Peak RSS in bytes (``VmHWM``; ``ru_maxrss`` where /proc is missing)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
