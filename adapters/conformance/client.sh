#!/usr/bin/env bash
# The MCP conformance suite's client under test: the real `flow` binary running a one-node
# workflow whose MCP tool points at the suite's server.
#
# The suite runs `client.sh <server-url>` with MCP_CONFORMANCE_SCENARIO (the scenario
# name) and, for authorization scenarios, MCP_CONFORMANCE_CONTEXT (JSON: client_id,
# client_secret or private_key_pem, …). FLOW_BIN names the binary (default: the debug
# build in $CARGO_TARGET_DIR or ./target).
set -euo pipefail
url="${!#}"
scenario="${MCP_CONFORMANCE_SCENARIO:-}"
context="${MCP_CONFORMANCE_CONTEXT:-{\}}"
flow="${FLOW_BIN:-${CARGO_TARGET_DIR:-$(dirname "$0")/../../target}/debug/flow}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2], ""))' "$context" "$1"; }

elicit=""
case "$scenario" in
  tools_call) tool=add_numbers; with='{ a: 5, b: 3 }' ;;
  sse-retry) tool=test_reconnection; with='{}' ;;
  elicitation-*) tool=test_client_elicitation_defaults; with='{}'; elicit='    elicitation: accept_defaults' ;;
  auth/*) tool=test-tool; with='{}' ;;
  *) tool=none; with='{}' ;;
esac

auth=""
client_id="$(field client_id)"
if [[ -n "$client_id" ]]; then
  export FLOW_SECRET_CLIENT_ID="$client_id"
  secret="$(field client_secret)"
  key="$(field private_key_pem)"
  if [[ -n "$key" ]]; then
    export FLOW_SECRET_PRIVATE_KEY="$key"
    auth='    auth: { oauth: { client_id: "${{ secrets.CLIENT_ID }}", private_key: "${{ secrets.PRIVATE_KEY }}", signing_algorithm: "'"$(field signing_algorithm)"'" } }'
  elif [[ -n "$secret" ]]; then
    export FLOW_SECRET_CLIENT_SECRET="$secret"
    auth='    auth: { oauth: { client_id: "${{ secrets.CLIENT_ID }}", client_secret: "${{ secrets.CLIENT_SECRET }}" } }'
  else
    auth='    auth: { oauth: { client_id: "${{ secrets.CLIENT_ID }}" } }'
  fi
fi

cat > "$work/conformance.yaml" <<YAML
name: conformance
tools:
  t:
    kind: mcp
    server: { url: "$url" }
    tool: $tool
    timeout: 20s
$auth
$elicit
nodes:
  call:
    tool: t
    with: $with
YAML
cat > "$work/flow.toml" <<'TOML'
[egress]
allow = ["localhost", "127.0.0.1", "::1"]
TOML
cd "$work"
exec "$flow" --db "sqlite://$work/flow.db" --config "$work/flow.toml" run conformance.yaml
