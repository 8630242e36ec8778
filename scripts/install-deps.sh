#!/usr/bin/env bash
# Installs the Debian packages Keel needs to build and test. Idempotent: it installs only what is
# missing, says what it installs, and uses sudo when not run as root.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libboost1.81-dev libboost-json1.81-dev libboost-url1.81-dev libboost-system1.81-dev
  libsqlite3-dev sqlite3 libpq-dev postgresql
  libssl-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libtomlplusplus-dev
  libarchive-dev liblua5.4-dev libre2-dev libhowardhinnant-date-dev tzdata zstd bubblewrap
  libedit-dev
  libgtest-dev libgmock-dev libbenchmark-dev libjemalloc-dev
  python3 curl openssl procps nodejs
  chromium fonts-liberation  # the dashboard's browser tests (tests/browser)
)

# npm comes with some nodejs builds (NodeSource) and separately with Debian's; ask for the
# Debian package only when no npm is there.
if ! command -v npm >/dev/null 2>&1; then PACKAGES+=(npm); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
