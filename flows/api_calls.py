"""Artifact calls to the Prefect API that a lost API cannot stall.

Measured (the ephemeral API killed at step ~10 of a 60-step ``rpeg train``): with the
client's 5 retries each progress artifact waited ~73 s in the sink's thread, so the last
step's metrics would have reached metrics.jsonl ~50 min after training ended. Here a call
retries once (:data:`API_RETRIES`), and an API that does not answer (:func:`unreachable`)
pauses the calls for :data:`API_PAUSE_S`, said once.

* :func:`api_call` -- one artifact call under those rules (used by rpeg.flows.artifacts).
* :func:`unreachable` -- an exception that means the API was not reached at all (no
  connection, a timeout), not an answer; also how the training entry tells a lost API apart.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("rpeg.flows.artifacts")  # the artifact helpers' channel


#: seconds the artifact calls stay off after the Prefect API did not answer (then one call
#: tries again)
API_PAUSE_S = 30.0
#: the client's retries for an artifact call (Prefect's default, 5, waits ~1 min on a dead
#: API); one still rides out a single 503 / 429 of a busy server
API_RETRIES = 1
_API_DOWN: dict[str, float] = {}  # API URL -> monotonic time until which calls are skipped


def api_call(what: str, fn, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)``, an artifact call to the Prefect API, with :data:`API_RETRIES`
    retries; its result, or None when it failed (logged: artifacts never fail a run). An
    API that does not answer pauses these calls for :data:`API_PAUSE_S` and is said once."""
    import time

    from prefect.settings import PREFECT_API_URL

    url = str(PREFECT_API_URL.value())
    now = time.monotonic()
    if now < _API_DOWN.get(url, 0.0):
        return None
    try:
        with _few_retries():
            out = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - artifacts never fail a run
        if not unreachable(exc):
            log.warning("could not publish %s artifact: %s: %s", what, type(exc).__name__, exc)
            return None
        if url not in _API_DOWN:
            log.warning(
                "the Prefect API does not answer (%s: %s): artifacts paused, tried again every "
                "%.0f s; metrics.jsonl and checkpoints are still written",
                type(exc).__name__,
                exc,
                API_PAUSE_S,
            )
        _API_DOWN[url] = now + API_PAUSE_S
        return None
    if _API_DOWN.pop(url, None) is not None:
        log.warning("the Prefect API answers again: artifacts resumed")
    return out


# current settings object -> (it, its copy with API_RETRIES): Prefect's temporary_settings
# rebuilds the whole Settings model on every entry (pydantic-settings re-reads the
# environment), which cost more of the flow process than the artifact call itself
_RETRY_SETTINGS: dict[int, tuple[Any, Any]] = {}


def _few_retries():
    """A settings context whose client makes :data:`API_RETRIES` retries (built once per
    settings object)."""
    import prefect.context
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

    ctx = prefect.context.get_settings_context()
    got = _RETRY_SETTINGS.get(id(ctx.settings))
    if got is None or got[0] is not ctx.settings:  # the original is held: its id stays its own
        got = (
            ctx.settings,
            ctx.settings.copy_with_update(updates={PREFECT_CLIENT_MAX_RETRIES: API_RETRIES}),
        )
        _RETRY_SETTINGS[id(ctx.settings)] = got
    return prefect.context.SettingsContext(profile=ctx.profile, settings=got[1])


def unreachable(exc: BaseException) -> bool:
    """A failure to reach the API at all (no connection, a timeout), not an answer."""
    import httpx

    return isinstance(exc, httpx.TransportError | OSError | TimeoutError)
