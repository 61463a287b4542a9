#!/usr/bin/env bash
# Build (and tag) the RPEG image: bash infra/docker/build.sh cpu|cuda [--push]
#   RPEG_IMAGE   repository (default ghcr.io/your-org/rpeg; the manifests in infra/k8s name it)
# Tags <repository>:<version>-<variant>, <version> from pyproject.toml. Needs Docker with
# BuildKit (for Dockerfile.dockerignore). Not run by CI here (no Docker daemon): the build
# context is checked by tests/ops/test_docker_context.py instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
variant=${1:?usage: build.sh cpu|cuda [--push]}
case "$variant" in cpu|cuda) ;; *) echo "variant: cpu or cuda, got $variant" >&2; exit 2 ;; esac
image=${RPEG_IMAGE:-ghcr.io/your-org/rpeg}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
tag="$image:$version-$variant"
DOCKER_BUILDKIT=1 docker build -f infra/docker/Dockerfile --target "$variant" -t "$tag" .
echo "built $tag"
if [ "${2:-}" = "--push" ]; then docker push "$tag"; fi
