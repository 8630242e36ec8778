#!/usr/bin/env bash
# Starts `keel serve` with a demo agent on the local model and says how to use it.
set -euo pipefail
KEEL_BIN=${1:-build/keel}
export KEEL_HOME=${KEEL_HOME:-$HOME/.local/share/keel}
LISTEN=${KEEL_LISTEN:-127.0.0.1:7878}
mkdir -p "$KEEL_HOME"
chmod 700 "$KEEL_HOME"
# Secrets need a key-encryption key. For this development server, one is generated once and kept
# in KEEL_HOME; a production deployment sets KEEL_SECRET_KEK from its own secret manager.
KEK_NOTE="  Secrets use KEEL_SECRET_KEK from the environment."
if [ -z "${KEEL_SECRET_KEK:-}" ]; then
  KEK_FILE=$KEEL_HOME/dev-secret-kek
  if [ ! -s "$KEK_FILE" ]; then
    (umask 077 && head -c 32 /dev/urandom | base64 > "$KEK_FILE")
    KEK_NOTE="  Generated a development key for secrets in $KEK_FILE (mode 0600); it is used
  as KEEL_SECRET_KEK. Keep it with the data: secrets cannot be read without it."
  else
    KEK_NOTE="  Secrets use the development key in $KEK_FILE as KEEL_SECRET_KEK."
  fi
  KEEL_SECRET_KEK=$(cat "$KEK_FILE")
  export KEEL_SECRET_KEK
fi
cat <<MSG

  Keel is starting on http://$LISTEN with its data in $KEEL_HOME
  The owner token is in $KEEL_HOME/owner.token (the keel CLI reads it from there).
$KEK_NOTE

  Try, in another terminal:
    export KEEL_HOME=$KEEL_HOME
    $KEEL_BIN send demo "/call time.now {}"
    $KEEL_BIN chat demo
    echo -n "s3cret" | $KEEL_BIN secrets set EXAMPLE_TOKEN && $KEEL_BIN secrets list
    curl -s -H "Authorization: Bearer \$(cat $KEEL_HOME/owner.token)" http://$LISTEN/v1/agents

  Stop with Ctrl-C.

MSG
exec "$KEEL_BIN" serve --listen "$LISTEN" --demo
