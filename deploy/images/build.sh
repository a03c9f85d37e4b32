#!/usr/bin/env bash
# Build the wheel once (`pip wheel . --no-deps`), then both images from that wheel alone, tagged as
# `mlcluster manifests` names them: name and tag come from the package
# (notebook_controller.manifests.DEFAULT_IMAGE, whose tag is jupyterlab_mlcluster/_version.py),
# never typed here.
#   deploy/images/build.sh                 # podman, else docker
#   CONTAINER_ENGINE=docker deploy/images/build.sh --push
#   deploy/images/build.sh --dry-run       # print the commands, run none
set -euo pipefail
cd "$(dirname "$0")/../.."
here=deploy/images
push=0 dry_run=0
for arg in "$@"; do
  case "$arg" in
    --push) push=1 ;;
    --dry-run) dry_run=1 ;;
    *) echo "build.sh: unknown option $arg (--push, --dry-run)" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python3}
engine=${CONTAINER_ENGINE:-$(command -v podman || command -v docker || true)}
if [ -z "$engine" ] && [ "$dry_run" = 0 ]; then
  echo "build.sh: neither podman nor docker found; set CONTAINER_ENGINE" >&2
  exit 1
fi
engine=${engine:-podman}

run() {
  if [ "$dry_run" = 1 ]; then echo "$*"; else "$@"; fi
}

controller_image=$(PYTHONPATH=$PWD "$PYTHON" -c \
  'from notebook_controller.manifests import DEFAULT_IMAGE; print(DEFAULT_IMAGE)')
version=${controller_image##*:}
notebook_image=${controller_image%/*}/notebook:$version

# The wheel build reuses a built labextension/ (pyproject's skip-if-exists): rebuild a sidebar
# older than its sources first, or the images would ship the old one.
built=labextension/static/style.js
if [ ! -f "$built" ] || [ -n "$(find src style schema package.json -newer "$built" -print -quit)" ]; then
  run jlpm build:prod
fi

wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
run "$PYTHON" -m pip wheel . --no-deps --quiet -w "$wheels"
wheel=$wheels/jupyterlab_mlcluster-$version-py3-none-any.whl
if [ "$dry_run" = 0 ] && [ ! -f "$wheel" ]; then
  echo "build.sh: the wheel is not version $version, the manifests' tag: $(ls "$wheels")" >&2
  exit 1
fi

# The wheel's folder is the whole build context: nothing else can be copied in.
run "$engine" build --build-arg "VERSION=$version" -t "$controller_image" \
  -f "$here/jupyterlab-mlcluster.Containerfile" "$wheels"
run "$engine" build --build-arg "VERSION=$version" -t "$notebook_image" \
  -f "$here/notebook.Containerfile" "$wheels"
if [ "$push" = 1 ]; then
  run "$engine" push "$controller_image"
  run "$engine" push "$notebook_image"
fi
