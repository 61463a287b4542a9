#!/usr/bin/env bash
# The test command: lint, layering contract, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
ruff format --check .
ruff check .
lint-imports
python -m pytest "$@"
