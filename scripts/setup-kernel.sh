#!/usr/bin/env bash
# Prepares this machine's kernel side for gpuscope's eBPF tests and demo (root, idempotent):
#  - tracefs mounted at /sys/kernel/tracing (bcc reads tracepoint formats there), bpffs at
#    /sys/fs/bpf (the probes are pinned there);
#  - OUT/debian: a merged header tree from Debian's installed linux-headers (the running
#    kernel has no matching headers package, and gpuscope's probes need none: see
#    agent/net/bpf_program.py);
#  - OUT/alt: a second, different header tree (another Debian kernel version, downloaded and
#    unpacked, not installed), to prove the probes compile against any tree.
set -euo pipefail
out=${1:?usage: setup-kernel.sh OUT}
here=$(cd "$(dirname "$0")" && pwd)

if [[ ! -d /sys/kernel/tracing/events && ! -d /sys/kernel/debug/tracing/events ]]; then
  mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null ||
    echo "setup-kernel: could not mount tracefs (eBPF tests will report it)" >&2
fi

# bpffs at /sys/fs/bpf: where `gpuscope bpf-load` pins the probes (systemd mounts it on most
# distributions; this machine's init does not).
if ! grep -qs ' /sys/fs/bpf bpf ' /proc/mounts; then
  mount -t bpf bpf /sys/fs/bpf 2>/dev/null ||
    echo "setup-kernel: could not mount bpffs at /sys/fs/bpf (eBPF tests will report it)" >&2
fi

mkdir -p "$out"
bash "$here/kernel-headers.sh" "$out/debian" >/dev/null

primary=$(basename "$(readlink -f "$out/debian/.source")")   # linux-headers-6.1.0-57-amd64
primary=${primary#linux-headers-}; primary=${primary%-amd64}
if [[ ! -f $out/alt/include/linux/kconfig.h ]]; then
  pick() { apt-cache search --names-only '^linux-headers-[0-9].*-common$' 2>/dev/null |
    sed -n 's/^linux-headers-\(.*\)-common .*/\1/p' | grep -v -e "^$primary\$" | sort -V | tail -n 1; }
  alt=$(pick)
  if [[ -z $alt ]]; then apt-get update -qq >/dev/null 2>&1 || true; alt=$(pick); fi
  if [[ -n $alt ]]; then
    bash "$here/kernel-headers.sh" "$out/alt" --download "$alt" >/dev/null 2>&1 ||
      { apt-get update -qq >/dev/null 2>&1; bash "$here/kernel-headers.sh" "$out/alt" --download "$alt" >/dev/null; }
  else
    echo "setup-kernel: no second kernel header version found in apt" >&2
  fi
fi
exit 0
