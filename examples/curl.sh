#!/usr/bin/env bash
# The OpenAI HTTP API of `ember serve` with nothing but curl.
#
#   ember serve                      # the demo model on http://127.0.0.1:8080
#   bash examples/curl.sh            # or: EMBER_URL=http://host:port EMBER_API_KEY=KEY bash examples/curl.sh
set -euo pipefail
URL="${EMBER_URL:-http://127.0.0.1:8080}"
AUTH=()
if [[ -n "${EMBER_API_KEY:-}" ]]; then AUTH=(-H "Authorization: Bearer ${EMBER_API_KEY}"); fi

echo "# GET /health"
curl -sS "$URL/health"
echo

echo "# GET /v1/models"
curl -sS "${AUTH[@]}" "$URL/v1/models"
echo

echo "# POST /v1/chat/completions"
curl -sS "${AUTH[@]}" "$URL/v1/chat/completions" -H "Content-Type: application/json" -d '{
  "messages": [{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": "What is the capital of France?"}],
  "max_tokens": 32, "temperature": 0}'
echo

echo "# POST /v1/completions, streamed (server-sent events, ends with data: [DONE])"
curl -sS -N "${AUTH[@]}" "$URL/v1/completions" -H "Content-Type: application/json" -d '{
  "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": true,
  "stream_options": {"include_usage": true}}'
echo
