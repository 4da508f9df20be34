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
connection=""
client_id="$(field client_id)"
secret="$(field client_secret)"
key="$(field private_key_pem)"
idp_id_token="$(field idp_id_token)"
cross_app=""
if [[ -n "$idp_id_token" ]]; then
  # Cross-app access: the suite plays the enterprise identity provider and hands over
  # the person's ID token; `flow connect` trades it for an ID-JAG and that for tokens.
  connection=conf
  auth='    auth: { connection: conf }'
  export FLOW_SECRET_CONF_CLIENT="$secret" FLOW_SECRET_IDP_ID_TOKEN="$idp_id_token"
  cross_app="$(printf 'client_secret_name = "CONF_CLIENT"\n\n[connections.cross_app]\nidp_token_endpoint = "%s"\nidp_client_id = "%s"\nid_token_secret = "IDP_ID_TOKEN"\n' "$(field idp_token_endpoint)" "$(field idp_client_id)")"
elif [[ "$scenario" == auth/* && -z "$secret" && -z "$key" ]]; then
  # An authorization-code scenario: sign in once with `flow connect` (the suite's
  # /authorize redirects at once, so curl is the browser), then run with the connection.
  connection=conf
  auth='    auth: { connection: conf }'
elif [[ -n "$client_id" ]]; then
  export FLOW_SECRET_CLIENT_ID="$client_id"
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
run=("$flow" --db "sqlite://$work/flow.db" --config "$work/flow.toml")
if [[ -n "$connection" ]]; then
  printf '[[connections]]\nname = "%s"\nserver = "%s"\n' "$connection" "$url" >> flow.toml
  if [[ -n "$client_id" ]]; then printf 'client_id = "%s"\n' "$client_id" >> flow.toml; fi
  if [[ -n "$cross_app" ]]; then printf '%b' "$cross_app" >> flow.toml; fi
  FLOW_SECRET_CONNECTIONS_KEY="$("$flow" connections keygen)"
  export FLOW_SECRET_CONNECTIONS_KEY
  "${run[@]}" connect "$connection" --by conformance --timeout 30s --browser "curl -sS -L -o /dev/null"
fi
if "${run[@]}" run conformance.yaml; then exit 0; fi
# A run refused for a scope (403 insufficient_scope) recorded the scope it wanted; a
# person would sign in again (flow connect asks for the union) and run it again.
if [[ -n "$connection" ]] && "${run[@]}" connections --json | grep -q '"scopes_wanted":"'; then
  "${run[@]}" connect "$connection" --by conformance --timeout 30s --browser "curl -sS -L -o /dev/null"
  exec "${run[@]}" run conformance.yaml
fi
exit 1
