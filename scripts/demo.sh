#!/usr/bin/env bash
# The main job: start a local cluster (`tandem up`: Redis, a draft worker, a target verifier,
# the Ray Serve app), stream one generation with `tandem generate`, then stop everything.
set -euo pipefail
cd "$(dirname "$0")/.."
port="${TANDEM_PORT:-9000}"
prompt="${1:-def fibonacci(n):}"
.venv/bin/tandem up --grpc-port "$port" &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT
.venv/bin/tandem generate --address "127.0.0.1:$port" --wait 300 --max-tokens 64 --temperature 0 "$prompt"
