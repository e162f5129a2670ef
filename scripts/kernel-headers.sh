#!/usr/bin/env bash
# Builds a merged kernel header tree that bcc can use through BCC_KERNEL_SOURCE.
#
# Debian splits a kernel's headers into an arch tree (linux-headers-X-amd64: .config,
# generated headers) and a common tree (linux-headers-X-common: include/, arch/*/include).
# bcc finds both only under /lib/modules/$(uname -r)/{build,source}; BCC_KERNEL_SOURCE takes
# a single directory. This merges the two into a symlink farm at OUT.
#
#   scripts/kernel-headers.sh OUT                 # the newest linux-headers-*-amd64 in /usr/src
#   scripts/kernel-headers.sh OUT --download VER  # Debian's linux-headers-VER-{amd64,common},
#                                                 # unpacked under OUT.pkgs (no install)
# gpuscope's probes read only tracepoint arguments and helpers, so any tree works: gpuscope
# uses this one when the host has none matching its kernel (see docs/architecture.md).
set -euo pipefail

out=${1:?usage: kernel-headers.sh OUT [--download VERSION]}
src=/usr/src
if [[ ${2:-} == --download ]]; then
  version=${3:?--download needs a version, e.g. 6.12.113+deb12}
  pkgs="$out.pkgs"
  if [[ ! -d $pkgs/usr/src/linux-headers-$version-common ]]; then
    rm -rf "$pkgs" && mkdir -p "$pkgs/debs"
    (cd "$pkgs/debs" && apt-get download -qq "linux-headers-$version-amd64" "linux-headers-$version-common")
    for deb in "$pkgs"/debs/*.deb; do dpkg-deb -x "$deb" "$pkgs"; done
  fi
  src="$pkgs/usr/src"
fi

arch=$(ls -d "$src"/linux-headers-*-amd64 2>/dev/null | grep -v -e cloud -e rt | sort -V | tail -n 1)
[[ -n $arch ]] || { echo "kernel-headers: no linux-headers-*-amd64 tree in $src" >&2; exit 1; }
common=$(sed -n 's/^include \(.*\)\/Makefile$/\1/p' "$arch/Makefile" | head -n 1)
[[ $common == /* ]] || common="$src/$(basename "${arch%-amd64}")-common"
[[ -d $common ]] || common="$src/$(basename "${arch%-amd64}")-common"
[[ -f $common/include/linux/kconfig.h ]] || { echo "kernel-headers: no common tree for $arch" >&2; exit 1; }

if [[ -f $out/include/linux/kconfig.h && -f $out/.config && $(readlink -f "$out/.source") == "$(readlink -f "$arch")" ]]; then
  exit 0  # already built from the same tree
fi
rm -rf "$out" && mkdir -p "$out"
cp -rs "$(readlink -f "$common")/." "$out/"
cp -rsf "$(readlink -f "$arch")/." "$out/"
ln -sfn "$(readlink -f "$arch")" "$out/.source"
echo "kernel-headers: $out <- $(basename "$arch") + $(basename "$common")"
