#!/usr/bin/env bash
# The device kit: everything a GPU machine without internet needs to run RPEG, built here.
#
#   bash scripts/device_kit.sh OUT [--python 3.12] [--max-mib 60] [--no-prefect]
#                                  [--image-wheels DIR]
#
# OUT/wheels/   the project's own wheel + binary wheels (manylinux x86_64, the target Python)
#               of every dependency the GPU image lacks (constraints/gpu_image.txt, a copy of
#               ../shared/gpu_image.txt: what is listed there never travels; torch, nvidia-*,
#               triton and vllm never do). Image packages whose versions the list names are
#               pinned to those versions while resolving, so the kit fits the image's numpy,
#               transformers, safetensors, tokenizers, ... (pins apply when --python is the
#               image's own Python, 3.12).
# OUT/install.sh  offline install (pip --no-index --no-deps) into the running python3, or
#               `--target DIR` (it prints the PYTHONPATH to export)
# OUT/gpu_check.py  the check to run there (a copy of scripts/gpu_check.py)
# OUT/image.txt  the image's packages the kit relies on (name==version as resolved here)
# --image-wheels DIR  also keep those packages' wheels in DIR (not part of the kit:
#               scripts/device_rehearsal.sh installs them as its stand-in for the image)
#
# Prefect and its ~70 dependencies are in the kit (measured 2026-12-02: 84 wheels, 38.1 MiB
# for Python 3.12): gpu_check.py runs the real flow. `--no-prefect` leaves them out (then the
# check refuses to run, naming Prefect).
# Prints the kit's total size and exits 1 above --max-mib (default 60: a device command carries
# at most 64 MiB, the repository's own files included).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
OUT=""
PYV=3.12
MAX_MIB=60
PREFECT=1
IMAGE_WHEELS=""
while (($#)); do
  case "$1" in
    --python) PYV="$2"; shift 2 ;;
    --max-mib) MAX_MIB="$2"; shift 2 ;;
    --no-prefect) PREFECT=0; shift ;;
    --image-wheels) IMAGE_WHEELS="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set /{/^#/p}' "$0"; exit 0 ;;
    -*) echo "device_kit: unknown option $1" >&2; exit 2 ;;
    *) OUT="$1"; shift ;;
  esac
done
if [[ -z "$OUT" ]]; then
  echo "usage: bash scripts/device_kit.sh OUT [--python 3.12] [--max-mib 60] [--no-prefect] [--image-wheels DIR]" >&2
  exit 2
fi
if ! [[ "$PYV" =~ ^3\.[0-9]+$ ]]; then
  echo "device_kit: --python $PYV: expected 3.N, e.g. 3.12" >&2
  exit 2
fi
IMAGE="${RPEG_GPU_IMAGE:-$root/constraints/gpu_image.txt}"
abi="cp${PYV/./}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/wheels" "$OUT/install.sh" "$OUT/gpu_check.py" "$OUT/kit.txt" "$OUT/image.txt"
mkdir -p "$OUT/wheels"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# what to download: the project's dependencies the image lacks; constraints: the image's versions
python3 - "$IMAGE" "$PREFECT" "$tmp" "$PYV" <<'PY'
import re, sys, tomllib
image_file, prefect, tmp, pyv = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have, pins, image_py = set(), {}, None
for line in open(image_file):
    if line.startswith("#"):
        m = re.search(r"python3 is Python (\d+\.\d+)", line)
        image_py = m.group(1) if m else image_py
        m = re.search(r"Versions read there:(.*)", line)
        for name, ver in re.findall(r"([A-Za-z0-9_.-]+) (\d[\w.]*)", m.group(1) if m else ""):
            pins[norm(name)] = ver.rstrip(".")
        continue
    have.update(norm(w) for w in line.split())
never = {"torch", "vllm", "triton"}
# packages that require torch: resolving them would download a CUDA torch (~GBs) and its
# nvidia-* wheels (it did: 7.5 GB for peft + accelerate). They are image packages (never in
# the kit), so they are fetched alone, without dependencies, for the image list and the
# rehearsal's stand-in image; their other dependencies are the image's and the kit's anyway.
torch_users = {"peft", "accelerate"}
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
# every dependency but torch is resolved (the image's own ones at the image's versions, to
# check that the kit fits them); only the wheels the image lacks go into the kit
want, alone = [], []
for d in deps:
    name = norm(re.match(r"[A-Za-z0-9_.-]+", d).group(0))
    if name in never or (name == "prefect" and not prefect):
        continue
    if name in torch_users:
        if name not in have:
            sys.exit(f"device_kit: {name} requires torch but the image lacks it: not shippable")
        alone.append(d)
        continue
    want.append(d)
# accelerate: peft's dependency, fetched alone with it
alone += [n for n in sorted(torch_users) if alone and n in have and not any(
    norm(re.match(r"[A-Za-z0-9_.-]+", a).group(0)) == n for a in alone)]
open(f"{tmp}/want.txt", "w").write("\n".join(want) + "\n")
open(f"{tmp}/alone.txt", "w").write("".join(a + "\n" for a in alone))
if image_py is not None and pyv != image_py:
    pins = {}  # another Python than the image's: its versions may have no wheels for it
open(f"{tmp}/pins.txt", "w").write("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())
                                          if n not in never))
open(f"{tmp}/have.txt", "w").write("\n".join(sorted(have | never)) + "\n")
PY
echo "device kit for Python $PYV ($abi, manylinux x86_64): resolving $(tr '\n' ' ' <"$tmp/want.txt")"
# pip's own constraints (PIP_CONSTRAINT, /etc/xdg/pip) pin this machine's torch: not the target's
PIP_CONSTRAINT= PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= python3 -m pip download -q \
  --only-binary=:all: --python-version "$PYV" --implementation cp --abi "$abi" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  -c "$tmp/pins.txt" -r "$tmp/want.txt" -d "$tmp/dl" >"$tmp/pip.log" 2>&1 || {
  echo "device_kit: pip download failed:" >&2
  tail -20 "$tmp/pip.log" >&2
  exit 1
}
if [[ -s "$tmp/alone.txt" ]]; then  # torch users: no dependencies (see torch_users above)
  PIP_CONSTRAINT= PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= python3 -m pip download -q \
    --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp --abi "$abi" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    -c "$tmp/pins.txt" -r "$tmp/alone.txt" -d "$tmp/dl" >>"$tmp/pip.log" 2>&1 || {
    echo "device_kit: pip download (torch users, no dependencies) failed:" >&2
    tail -20 "$tmp/pip.log" >&2
    exit 1
  }
fi
if ls "$tmp/dl" | grep -qiE '^(torch|triton|nvidia)[-_]'; then  # never again a CUDA torch
  echo "device_kit: the resolution pulled torch/triton/nvidia wheels (a dependency requires" >&2
  echo "torch: add it to torch_users):" >&2
  ls "$tmp/dl" | grep -iE '^(torch|triton|nvidia)[-_]' >&2
  exit 1
fi
# keep what the image lacks; list (and optionally keep) what it provides
: >"$OUT/image.txt"
[[ -n "$IMAGE_WHEELS" ]] && mkdir -p "$IMAGE_WHEELS"
for w in "$tmp"/dl/*.whl; do
  base=$(basename "$w")
  name=$(echo "$base" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')
  if grep -qx "$name" "$tmp/have.txt" || [[ "$name" == nvidia-* ]]; then
    echo "$name==$(echo "$base" | cut -d- -f2)" >>"$OUT/image.txt"
    [[ -n "$IMAGE_WHEELS" ]] && cp "$w" "$IMAGE_WHEELS/"
    continue
  fi
  cp "$w" "$OUT/wheels/"
done
# the project's own wheel, built from a copy of the tree (no build/ or egg-info left here)
mkdir -p "$tmp/src"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [[ -e "$f" ]] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$tmp/src"
python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$OUT/wheels" "$tmp/src" \
  >"$tmp/wheel.log" 2>&1 || { cat "$tmp/wheel.log" >&2; exit 1; }
if ls "$OUT/wheels" | grep -qiE '^(torch|vllm|triton|nvidia)[-_]'; then
  echo "device_kit: a torch/vllm/triton/nvidia wheel got into the kit:" >&2
  ls "$OUT/wheels" | grep -iE '^(torch|vllm|triton|nvidia)[-_]' >&2
  exit 1
fi
cp scripts/gpu_check.py "$OUT/gpu_check.py"
(cd "$OUT/wheels" && ls -1 *.whl) >"$OUT/kit.txt"

cat >"$OUT/install.sh" <<'SH'
#!/usr/bin/env bash
# Offline install of the RPEG device kit (no index, no dependency resolution: the kit was
# resolved against the GPU image's packages when it was built).
#   bash install.sh                 into the running python3's environment
#   bash install.sh --target DIR    into DIR; prints the PYTHONPATH to export
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PY="${PYTHON:-python3}"
args=(--no-index --no-deps --find-links "$here/wheels" --disable-pip-version-check -q)
if [[ "${1:-}" == "--target" ]]; then
  [[ -n "${2:-}" ]] || { echo "install.sh: --target needs a folder" >&2; exit 2; }
  mkdir -p "$2"
  target=$(cd "$2" && pwd)
  PIP_CONSTRAINT= "$PY" -m pip install "${args[@]}" --target "$target" "$here"/wheels/*.whl
  echo "installed into $target; before running: export PYTHONPATH=$target\${PYTHONPATH:+:\$PYTHONPATH}"
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
else
  PIP_CONSTRAINT= "$PY" -m pip install "${args[@]}" "$here"/wheels/*.whl
fi
# from / : a checkout in the current folder must not stand in for the installed package
(cd / && "$PY" -c "import rpeg, rpeg.infra.cluster, rpeg.flows.train, rpeg.runtime.actors.rank; print('rpeg importable from', rpeg.__path__[0])")
SH
chmod +x "$OUT/install.sh"
bytes=$(du -cb "$OUT"/wheels/*.whl | tail -1 | cut -f1)
mib=$(python3 -c "print(f'{$bytes / 2**20:.1f}')")
echo "device kit: $OUT ($(wc -l <"$OUT/kit.txt") wheels, $mib MiB; Prefect $([[ $PREFECT == 1 ]] && echo included || echo 'left out'); relies on $(wc -l <"$OUT/image.txt") image packages: image.txt)"
if ((bytes > MAX_MIB * 1048576)); then
  echo "device_kit: $mib MiB is over the $MAX_MIB MiB budget; largest wheels:" >&2
  (cd "$OUT/wheels" && ls -S -s --block-size=K *.whl | head -8) >&2
  exit 1
fi
