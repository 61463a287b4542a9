#!/usr/bin/env bash
# Does `pip install ".[gpu]"` resolve on a Linux x86-64 GPU machine (vllm + dask-cuda against
# the core's torch, prefect and dask ranges) for Python 3.12, the GPU image's (RPEG_GPU_PYTHON
# overrides)? A resolver check with uv (metadata only, no
# sdist builds, nothing installed; uv is fetched into a temp dir when missing): pip's own
# dry run downloads every candidate vllm wheel (~330 MB each) while it backtracks.
# Exit 1 with the resolver's explanation when the extra does not resolve; a machine that
# cannot reach the package index skips with a note (exit 0): that says nothing about the ranges.
set -uo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
uvbin=$(command -v uv || true)
if [[ -z "$uvbin" ]]; then
  if pip install -q --target "$tmp/uv" uv >"$tmp/pip.log" 2>&1; then
    uvbin="$tmp/uv/bin/uv"
  else
    echo "gpu extra check skipped: uv could not be installed:" >&2
    tail -3 "$tmp/pip.log" >&2
    exit 0
  fi
fi
if timeout "${RPEG_GPU_EXTRA_TIMEOUT_S:-600}" "$uvbin" pip compile --quiet --no-build \
  --python-version "${RPEG_GPU_PYTHON:-3.12}" --python-platform x86_64-manylinux_2_28 --extra gpu \
  pyproject.toml -o "$tmp/gpu.txt" >"$tmp/uv.log" 2>&1; then
  echo "gpu extra resolves: $(grep -E '^(vllm|dask-cuda|torch|dask|prefect)==' "$tmp/gpu.txt" | tr '\n' ' ')"
  exit 0
fi
if grep -qE "No solution found|unsatisfiable" "$tmp/uv.log"; then
  echo "the gpu extra does not resolve:" >&2
  cat "$tmp/uv.log" >&2
  exit 1
fi
echo "gpu extra check skipped: the package index could not be used here:" >&2
tail -5 "$tmp/uv.log" >&2
exit 0
