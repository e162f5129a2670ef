#!/usr/bin/env bash
# Installs the Debian packages gpuscope's build, tests and demo need.
# Idempotent: when every package is already installed it does not touch apt at all.
set -euo pipefail

packages=(
  build-essential   # cc for the fake NVML library
  python3-venv      # the project's virtual environment
  python3-dev
  prometheus        # promtool (golden files are linted) and a real Prometheus server for e2e tests
  victoria-metrics  # `make bench-fleet`: a second store that Prometheus remote-writes to
  python3-bpfcc     # bcc: the eBPF network probes (pure Python over libbcc)
  linux-headers-amd64  # a kernel header tree for bcc (the running kernel may have none)
  iperf3            # traffic for the network tests and benchmarks
  nftables          # packet loss between test network namespaces (no netem here)
  iproute2          # network namespaces and veth pairs
  libcap2-bin       # capsh: least-privilege tests
  bpftool           # per-program BPF run-time statistics in bench/bench_net.py
  podman            # `make image`: builds daemonset/Dockerfile without a Docker engine
  mmdebstrap        # `make image`: the Debian base image, where no registry is reachable
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: need root to install: ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts the prometheus and victoria-metrics services on install; gpuscope's tests and
# benchmarks start their own on loopback.
for service in prometheus victoria-metrics; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$service" 2>/dev/null; then
    systemctl stop "$service" || true
  fi
done
