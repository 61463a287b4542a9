#!/usr/bin/env bash
# CPU rehearsal of the device kit (scripts/device_kit.sh), run by .ci/run on every commit:
# everything the first GPU run will do, except CUDA itself.
#
#   bash scripts/device_rehearsal.sh [WORKDIR]      (default: a temporary folder, removed)
#
# 1. resolves and downloads the GPU machine's kit (Python 3.12, manylinux x86_64) and checks
#    its size (<= 60 MiB, no torch / nvidia-* / vllm wheels);
# 2. builds the same kit for this machine's Python (3.11: the local CPU torch wheel exists
#    only for cp311), keeping the wheels of the image's packages it relies on;
# 3. makes a fresh virtual environment holding only torch (the local CPU wheel,
#    constraints/cpu.txt) and those image packages (transformers, safetensors, numpy, httpx,
#    ...: the stand-in for the GPU image), then installs the kit with its own install.sh,
#    offline (no index);
# 4. runs the kit's gpu_check.py --device cpu (two ranks on gloo, fp32, a 2-layer model,
#    2 steps) from outside the repository, so the installed wheel is what runs.
# Prints the seconds of each part. Needs the package index for steps 1-3 (pip's cache makes
# reruns fast).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
if [[ -n "${1:-}" ]]; then
  work="$1"
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
work=$(cd "$work" && pwd)
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
t0=$SECONDS
lap() { echo "rehearsal: $1 ($((SECONDS - t0)) s so far)"; }

# the two kits resolve at once (pip's resolver is the slow part)
pyv=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
bash scripts/device_kit.sh "$work/kit-3.12" --python 3.12 >"$work/kit-3.12.log" 2>&1 &
k312=$!
bash scripts/device_kit.sh "$work/kit" --python "$pyv" --image-wheels "$work/image-wheels"
lap "$pyv kit built"
if ! wait "$k312"; then
  cat "$work/kit-3.12.log" >&2
  echo "rehearsal: the Python 3.12 kit failed" >&2
  exit 1
fi
cat "$work/kit-3.12.log"
lap "3.12 kit resolved and size-checked"

rm -rf "$work/venv"
python3 -m venv "$work/venv"
vpy="$work/venv/bin/python"
# torch alone (no dependencies) from the on-disk CPU wheel, unpacked once into a cache folder
# that the venv reads through a .pth file (unpacking the ~200 MB wheel took ~1-2 min here);
# then the image's packages the kit relies on (torch's own dependencies among them), from
# the wheels the kit build kept: the venv holds nothing else (the kit goes into its own
# site-packages).
tver=$(grep -E '^torch==' constraints/cpu.txt | cut -d= -f3)
tcache="${XDG_CACHE_HOME:-$HOME/.cache}/rpeg-rehearsal/torch-$tver-cp${pyv/./}"
if [[ ! -f "$tcache/.complete" ]]; then
  rm -rf "$tcache"
  python3 -m pip install -q --no-deps --target "$tcache" -c constraints/cpu.txt torch
  touch "$tcache/.complete"
fi
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$tcache" >"$site/rpeg-rehearsal-torch.pth"
# the image's packages likewise: unpacked once per exact list (the kit's image.txt) into a
# cache folder read through a .pth (installing them took ~4 min at load ~15 on 2 cores)
key=$(sha256sum "$work/kit/image.txt" | cut -c1-16)
icache="${XDG_CACHE_HOME:-$HOME/.cache}/rpeg-rehearsal/image-$key-cp${pyv/./}"
if [[ ! -f "$icache/.complete" ]]; then
  rm -rf "$icache"
  python3 -m pip install -q --no-deps --no-index --target "$icache" "$work"/image-wheels/*.whl
  touch "$icache/.complete"
fi
echo "$icache" >"$site/rpeg-rehearsal-image.pth"
"$vpy" -c "import torch; assert torch.__version__.startswith('$tver'), torch.__version__"
lap "fresh venv: torch $tver + $(ls "$work"/image-wheels/*.whl | wc -l) image packages"
PATH="$work/venv/bin:$PATH" PIP_FIND_LINKS= PIP_CONSTRAINT= bash "$work/kit/install.sh"
lap "kit installed offline"

cd "$work"  # not the repository: the installed wheel runs
export PREFECT_HOME="$work/prefect-home"  # the venv's Prefect keeps its own database
"$vpy" -c "import rpeg, sys; assert '$root' not in (rpeg.__file__ or ''), rpeg.__file__"
"$vpy" kit/gpu_check.py --device cpu --steps 2 --out "$work/check" --json "$work/check.json"
"$vpy" - "$work/check.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["steps"] == 2 and r["flow"] == "prefect", r
assert r["stages"] and all(s["measured_s"] is not None for s in r["stages"]), r["stages"]
assert r["memory"] and r["predicted_step_s"] > 0, r
print(f"rehearsal: gpu_check figures OK ({len(r['stages'])} stages, {len(r['memory'])} ranks)")
PY
lap "gpu_check --device cpu passed"
