#!/usr/bin/env bash
# Starts `keel serve` with a demo agent on the local model and says how to use it.
set -euo pipefail
KEEL_BIN=${1:-build/keel}
export KEEL_HOME=${KEEL_HOME:-$HOME/.local/share/keel}
LISTEN=${KEEL_LISTEN:-127.0.0.1:7878}
mkdir -p "$KEEL_HOME"
chmod 700 "$KEEL_HOME"
# Secrets need a key-encryption key. For this development server, one is generated once and kept
# outside KEEL_HOME (a copy of the data directory should not carry the key that opens it) and
# passed by file, so that it never sits in an environment; a production deployment sets
# KEEL_SECRET_KEK or KEEL_SECRET_KEK_FILE from its own secret manager.
KEK_NOTE="  Secrets use the key-encryption key from the environment."
if [ -z "${KEEL_SECRET_KEK:-}" ] && [ -z "${KEEL_SECRET_KEK_FILE:-}" ]; then
  KEK_DIR=${XDG_CONFIG_HOME:-$HOME/.config}/keel
  KEK_FILE=$KEK_DIR/dev-secret-kek
  mkdir -p "$KEK_DIR"
  chmod 700 "$KEK_DIR"
  if [ ! -s "$KEK_FILE" ] && [ -s "$KEEL_HOME/dev-secret-kek" ]; then
    # Kept in KEEL_HOME by earlier versions of this script: moved out.
    mv "$KEEL_HOME/dev-secret-kek" "$KEK_FILE"
  fi
  if [ ! -s "$KEK_FILE" ]; then
    (umask 077 && head -c 32 /dev/urandom | base64 > "$KEK_FILE")
    KEK_NOTE="  Generated a development key for secrets in $KEK_FILE (mode 0600); it is used
  as KEEL_SECRET_KEK_FILE. Keep it with the data: secrets cannot be read without it."
  else
    KEK_NOTE="  Secrets use the development key in $KEK_FILE (KEEL_SECRET_KEK_FILE)."
  fi
  export KEEL_SECRET_KEK_FILE=$KEK_FILE
fi
cat <<MSG

  Keel is starting on http://$LISTEN with its data in $KEEL_HOME
  The owner token is in $KEEL_HOME/owner.token (the keel CLI reads it from there).
$KEK_NOTE

  The dashboard: open http://$LISTEN/ in a browser and sign in with the owner token
  (cat $KEEL_HOME/owner.token).

  Try, in another terminal:
    export KEEL_HOME=$KEEL_HOME
    $KEEL_BIN send demo "/call time.now {}"
    $KEEL_BIN chat demo
    echo -n "s3cret" | $KEEL_BIN secrets set EXAMPLE_TOKEN && $KEEL_BIN secrets list
    curl -s -H "Authorization: Bearer \$(cat $KEEL_HOME/owner.token)" http://$LISTEN/v1/agents

  Stop with Ctrl-C.

MSG
exec "$KEEL_BIN" serve --listen "$LISTEN" --demo
