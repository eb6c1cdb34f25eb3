#!/usr/bin/env bash
# The main job: start a local cluster (`tandem up`: Redis, a draft worker, a target verifier,
# the Ray Serve app), stream one generation with `tandem generate`, answer one more through the
# OpenAI-compatible API with the `openai` client, then stop everything.
set -euo pipefail
cd "$(dirname "$0")/.."
port="${TANDEM_PORT:-9000}"
http_port="${TANDEM_HTTP_PORT:-8000}"
prompt="${1:-def fibonacci(n):}"
.venv/bin/tandem up --grpc-port "$port" --http-port "$http_port" &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT
.venv/bin/tandem generate --address "127.0.0.1:$port" --wait 300 --max-tokens 64 --temperature 0 "$prompt"
.venv/bin/python - "$http_port" <<'PY'
import sys
from openai import OpenAI

client = OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="none")
answer = client.completions.create(model=client.models.list().data[0].id, prompt="import os\n", max_tokens=32,
                                   temperature=0)
spec = answer.model_extra["metrics"]["speculative_decoding"]
print(f"\n[OpenAI API] {answer.choices[0].text!r}\n[{answer.usage.completion_tokens} tokens, mean acceptance "
      f"length {spec['mean_acceptance_length']:.2f}, draft acceptance rate {spec['draft_acceptance_rate']:.2f}]")
PY
