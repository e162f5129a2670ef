#!/usr/bin/env bash
# Builds the image's fallback kernel header tree: one self-contained directory (no symlink
# leaves it) that bcc can use through BCC_KERNEL_SOURCE, i.e. the agent's --kernel-headers.
#
#   fallback-kernel-headers.sh OUT [SRC]   # SRC: where linux-headers-*-{ARCH,common} are
#                                          # (default /usr/src)
#
# ARCH is the image's architecture: $TARGETARCH (the Dockerfile's build argument, which
# `docker buildx build --platform` sets), else this system's (dpkg); amd64 or arm64, whose
# Docker and Debian names agree. Debian splits a kernel's headers into an arch tree
# (linux-headers-X-ARCH: .config, generated headers) and a common tree
# (linux-headers-X-common: include/, arch/*/). Unlike scripts/kernel-headers.sh (a symlink
# farm for the test machine), this copies both into OUT, keeping only what bcc compiles
# against: include/, arch/x86/ (amd64) or arch/arm64/ (arm64), .config and the Makefiles. The
# kbuild scripts and tools and the other architectures' headers are left out (about 25 MB).
# gpuscope's probes read only tracepoint arguments and BPF helpers, so a tree of another
# kernel version works (docs/network.md); tests/deploy/test_deploy_manifests.py loads the probes
# against a tree built by this script.
set -euo pipefail
out=${1:?usage: fallback-kernel-headers.sh OUT [SRC]}
src=${2:-/usr/src}

deb_arch=${TARGETARCH:-$(dpkg --print-architecture)}
case $deb_arch in
  amd64) kernel_arch=x86 ;;
  arm64) kernel_arch=arm64 ;;
  *) echo "fallback-kernel-headers: unsupported architecture $deb_arch (amd64 or arm64)" >&2
     exit 1 ;;
esac

arch=$(ls -d "$src"/linux-headers-*-"$deb_arch" 2>/dev/null | grep -v -e cloud -e rt | sort -V |
  tail -n 1 || true)
[[ -n $arch ]] || {
  echo "fallback-kernel-headers: no linux-headers-*-$deb_arch in $src" >&2; exit 1; }
common="${arch%-"$deb_arch"}-common"
[[ -f $common/include/linux/kconfig.h ]] || {
  echo "fallback-kernel-headers: no common tree $common" >&2; exit 1; }

rm -rf "$out" && mkdir -p "$out/arch"
# The common tree first, then the arch tree over it (its generated headers and .config win).
cp -a "$common/include" "$common/Makefile" "$out/"
cp -a "$common/arch/$kernel_arch" "$out/arch/"
(cd "$arch" && tar -cf - --exclude=./scripts --exclude=./tools --exclude=./Module.symvers \
  --exclude=./Makefile .) | tar -xf - -C "$out"
# Symlinks that stay inside the tree are fine; any other would dangle in the image.
while IFS= read -r link; do
  target=$(readlink -f "$link" || true)
  if [[ -z $target || $target != "$(readlink -f "$out")"/* || ! -e $target ]]; then
    echo "fallback-kernel-headers: $link points outside the tree" >&2; exit 1
  fi
done < <(find "$out" -type l)
[[ -f $out/include/linux/kconfig.h && -f $out/.config ]]
echo "fallback-kernel-headers: $out <- $(basename "$arch") + $(basename "$common")" \
  "($(du -sh "$out" | cut -f1))"
