#!/usr/bin/env bash
# The one command that makes the generated wire code: protos/tandem/v1/*.proto -> tandem/v1/.
# Generated files are committed (so `pip install` needs no protoc) and never edited;
# tests/test_protos.py fails when they drift from the .proto sources.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
python="${PYTHON:-$root/.venv/bin/python}"
"$python" -m grpc_tools.protoc -I "$root/protos" \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "$root"/protos/tandem/v1/*.proto
