"""The image the Kubernetes manifests run is one this repository builds: a lint of
infra/docker (no Docker daemon here: the build itself is not run)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "infra" / "docker"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _tags(variant: str) -> str:
    """The tag build.sh gives a variant (its defaults: RPEG_IMAGE unset)."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return f"ghcr.io/your-org/rpeg:{version}-{variant}"


def test_every_copied_path_exists_and_is_not_ignored():
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {x[1:].rstrip("/") for x in ignore if x.startswith("!")}
    copies = [args for ins, args in _instructions() if ins == "COPY" and "--from=" not in args]
    assert copies
    for args in copies:
        *sources, _dest = args.split()
        for src in sources:
            path = REPO / src.rstrip("/")
            assert path.exists(), f"COPY {src}: not in the build context (the repository root)"
            assert src.rstrip("/") in allowed, f"COPY {src}: Dockerfile.dockerignore excludes it"
    # everything the package install needs (setup.py maps flows/, tasks/, infra/ into rpeg)
    copied = {s.rstrip("/") for a in copies for s in a.split()[:-1]}
    assert {"pyproject.toml", "setup.py", "rpeg", "flows", "tasks", "infra"} <= copied


def test_targets_install_extras_that_exist():
    extras = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    stages = [args.split()[-1] for ins, args in _instructions() if ins == "FROM"]
    assert {"cpu", "cuda"} <= set(stages)
    for ins, args in _instructions():
        if ins == "RUN" and "pip install" in args:
            for named in re.findall(r"/opt/rpeg\[([^\]]+)\]", args):
                assert set(named.split(",")) <= extras, named
    # the CPU variant takes torch from the CPU index and checks that it got a CPU build
    args = dict(a.split("=", 1) for i, a in _instructions() if i == "ARG" and "=" in a)
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    runs = [a for i, a in _instructions() if i == "RUN" and "TORCH_INDEX" in a]
    assert runs and all("assert not torch.version.cuda" in r for r in runs)


def test_manifests_run_the_image_build_sh_tags():
    build = (DOCKER / "build.sh").read_text()
    assert "ghcr.io/your-org/rpeg" in build and '--target "$variant"' in build
    subprocess.run(["bash", "-n", str(DOCKER / "build.sh")], check=True)
    ours = set()
    for f in sorted((REPO / "infra" / "k8s").glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            for image in re.findall(r"image: (\S+)", yaml.safe_dump(d)):
                if "rpeg" in image.split("/")[-1]:
                    ours.add(image)
    assert ours, "no manifest runs the RPEG image"
    assert ours <= {_tags("cpu"), _tags("cuda")}, ours
