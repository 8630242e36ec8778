#!/usr/bin/env bash
# Installs the reference MCP servers the MCP client tests run against, the official MCP
# conformance suite (0.1.13: the newest that runs on Debian's Node.js 20) and the official
# OpenAI SDK (6.x: 7 needs Node.js 22; test_openai_front.py), from npm, into a
# cache directory (default $HOME/.cache/keel-mcp-servers; or the first argument; or KEEL_TEST_MCP_DIR).
# Idempotent: packages already there are not fetched again. Prints what it does, and on success
# nothing else. Point the tests at the directory with KEEL_TEST_MCP_DIR=<dir>.
#
#   bash scripts/install-mcp-test-servers.sh [DIR]
set -euo pipefail

DIR=${1:-${KEEL_TEST_MCP_DIR:-$HOME/.cache/keel-mcp-servers}}
# Pinned, so that CI runs against the servers the tests were written for.
PACKAGES=(@modelcontextprotocol/server-everything@2026.8.31
          @modelcontextprotocol/server-filesystem@2026.8.31
          @modelcontextprotocol/conformance@0.1.13
          openai@6.49.0)

for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "install-mcp-test-servers: $tool is missing (apt-get install nodejs npm)" >&2
    exit 1
  fi
done

missing=()
for p in "${PACKAGES[@]}"; do
  # Present only at the pinned version.
  grep -qs "\"version\": \"${p##*@}\"" "$DIR/node_modules/${p%@*}/package.json" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-mcp-test-servers: ${PACKAGES[*]} present in $DIR"
  exit 0
fi

mkdir -p "$DIR"
echo "install-mcp-test-servers: npm install --prefix $DIR ${missing[*]}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! npm install --prefix "$DIR" --save-exact --no-audit --no-fund --loglevel=error "${missing[@]}" \
    >"$log" 2>&1; then
  cat "$log" >&2
  echo "install-mcp-test-servers: npm install failed" >&2
  exit 1
fi
