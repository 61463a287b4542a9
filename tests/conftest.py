"""Suite-wide isolation: no user state on the machine changes a test's outcome."""

import os

import pytest

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(autouse=True, scope="session")
def _isolated_user_specs(tmp_path_factory):
    """`rpeg specs calibrate` writes user spec overrides that the catalog loader prefers;
    tests read the shipped catalog only."""
    old = os.environ.get("RPEG_SPECS_DIR")
    os.environ["RPEG_SPECS_DIR"] = str(tmp_path_factory.mktemp("user-specs"))
    from rpeg import specs

    specs.reload()
    yield
    if old is None:
        os.environ.pop("RPEG_SPECS_DIR", None)
    else:
        os.environ["RPEG_SPECS_DIR"] = old
