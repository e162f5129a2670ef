#!/usr/bin/env bash
# Builds daemonset/Dockerfile with podman, as `make image` does (docs/deploy.md, "The image").
#
#   build-image.sh TAG VERSION
#
# No registry is needed. The base image the Dockerfile names is used when podman has it;
# otherwise it is made here with mmdebstrap from this machine's apt sources, the way Docker's
# debian:bookworm-slim is made (merged /usr without the usrmerge package, which would pull in
# perl; no manuals, documentation or translations, and dpkg keeps leaving them out), and
# imported under the base's name.
#
# This machine's pip configuration (index, certificate bundle, timeout, proxy) and apt proxy
# reach the build through read-only mounts under /run/host-build for the RUN steps alone:
# nothing of them is copied into a layer or recorded in the image's history.
#
# Builds run with `--isolation chroot`, which needs no container runtime: this works where
# containers cannot start (hybrid cgroups, no setrlimit), as on the project's machines.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:?usage: build-image.sh TAG VERSION}
version=${2:?usage: build-image.sh TAG VERSION}
dockerfile=daemonset/Dockerfile
work=build/image

for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || {
    echo "build-image: $tool is missing: run \`make deps\` (scripts/install-deps.sh)" >&2
    exit 1
  }
done

# The base: the Dockerfile's own FROM (both stages use the same one).
mapfile -t bases < <(sed -n 's/^FROM[[:space:]]\+\([^[:space:]]\+\).*/\1/p' "$dockerfile" | sort -u)
if ((${#bases[@]} != 1)); then
  echo "build-image: expected one base image in $dockerfile, found: ${bases[*]}" >&2
  exit 1
fi
base=${bases[0]}
case $base in */*) ;; *) base=docker.io/library/$base ;; esac
suite=${base##*:}
suite=${suite%-slim}

mkdir -p "$work"
if ! podman image exists "$base"; then
  echo "build-image: $base is not here; making it with mmdebstrap ($suite, apt sources of this machine)"
  rm -f "$work/base.tar"
  mmdebstrap --quiet --variant=apt --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    "$suite" "$work/base.tar"
  podman import --quiet "$work/base.tar" "$base" >/dev/null
  rm -f "$work/base.tar"
fi

# This machine's pip and apt settings, for the build's RUN steps only.
host=$work/host-build
rm -rf "$host" && mkdir -p "$host"
mounts=()
python3 scripts/host-build-config.py "$host"
[[ -f $host/pip.conf ]] && mounts+=(-v "$PWD/$host/pip.conf:/etc/pip.conf:ro")
[[ -f $host/apt-proxy.conf ]] &&
  mounts+=(-v "$PWD/$host/apt-proxy.conf:/etc/apt/apt.conf.d/99host-proxy:ro")
mounts+=(-v "$PWD/$host:/run/host-build:ro")

podman build --quiet --isolation chroot --format docker --network host \
  "${mounts[@]}" --build-arg "VERSION=$version" --build-arg "TARGETARCH=$(dpkg --print-architecture)" -f "$dockerfile" -t "$tag" . >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$tag")
echo "build-image: $tag built, $((size / 1000000)) MB"
