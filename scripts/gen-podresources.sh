#!/usr/bin/env bash
# Regenerates the Python stubs for the kubelet PodResources v1 API from the vendored proto:
#   agent/k8s/podresources/v1/api_pb2.py, api_pb2.pyi (types for mypy), api_pb2_grpc.py
# The stubs are committed so that installing gpuscope needs no protoc; rerun this only after
# changing api.proto or the grpcio-tools pin, and commit the result.
#
# protoc runs from the repository root with the proto named by its import path (through the
# gpuscope/agent link, docs/architecture.md), so the grpc module imports
# `gpuscope.agent.k8s.podresources.v1.api_pb2` instead of a top-level `api_pb2` that would
# only resolve with the directory on sys.path. The proto package stays
# `v1`, so the wire names (/v1.PodResourcesLister/List, ...) are the kubelet's.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=gpuscope/agent/k8s/podresources/v1

# The generated code embeds the versions that produced it and checks them against the runtime
# at import, so generate only with the pinned tools: the output is then reproducible.
pinned() { sed -n "s/^$1==//p" requirements-dev.txt; }
for pkg in grpcio-tools protobuf grpcio; do
  want=$(pinned "$pkg")
  have=$("$PY" -c "import importlib.metadata as m; print(m.version('$pkg'))")
  if [[ "$want" != "$have" ]]; then
    echo "gen-podresources: $pkg is $have in $PY, requirements-dev.txt pins $want (run make venv)" >&2
    exit 1
  fi
done

"$PY" -m grpc_tools.protoc -I . \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  "$OUT/api.proto"

if ! grep -q '^from gpuscope\.agent\.k8s\.podresources\.v1 import api_pb2 ' "$OUT/api_pb2_grpc.py"; then
  echo "gen-podresources: unexpected import in $OUT/api_pb2_grpc.py" >&2
  exit 1
fi
echo "gen-podresources: wrote $OUT/api_pb2.py, api_pb2.pyi, api_pb2_grpc.py" \
  "(grpcio-tools $(pinned grpcio-tools), protobuf $(pinned protobuf))"
