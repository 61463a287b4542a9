#!/usr/bin/env bash
# The test command: lint, layering contract, type check, then the test suite without the `slow` tests
# (end-to-end runs on Dask clusters, spawned process groups, minutes-long learning checks).
# `bash scripts/test.sh -m slow` runs exactly those (a later -m wins); `.ci/run` runs both.
set -euo pipefail
cd "$(dirname "$0")/.."
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
ruff format --check .
ruff check .
lint-imports
mypy  # [tool.mypy] in pyproject.toml: rpeg.compile, rpeg.runtime.step and rpeg.runtime.actors, strict
python -m pytest -m "not slow" "$@"
