#!/usr/bin/env bash
# Starts `keel serve` with a demo agent on the local model and says how to use it.
set -euo pipefail
KEEL_BIN=${1:-build/keel}
export KEEL_HOME=${KEEL_HOME:-$HOME/.local/share/keel}
LISTEN=${KEEL_LISTEN:-127.0.0.1:7878}
mkdir -p "$KEEL_HOME"
cat <<MSG

  Keel is starting on http://$LISTEN with its data in $KEEL_HOME
  The owner token is in $KEEL_HOME/owner.token (the keel CLI reads it from there).

  Try, in another terminal:
    export KEEL_HOME=$KEEL_HOME
    $KEEL_BIN send demo "/call time.now {}"
    $KEEL_BIN chat demo
    curl -s -H "Authorization: Bearer \$(cat $KEEL_HOME/owner.token)" http://$LISTEN/v1/agents

  Stop with Ctrl-C.

MSG
exec "$KEEL_BIN" serve --listen "$LISTEN" --demo
