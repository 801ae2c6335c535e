#!/usr/bin/env bash
# Install Debian packages that some tests need:
#   scripts/install_debian_packages.sh NAME "WHAT FOR" PACKAGE...
# (scripts/install_browser.sh, install_ha_deps.sh and install_pgbouncer.sh call it).
#
# Idempotent and fast once installed (a dpkg query, no network). Where apt is not
# available it skips with a message and those tests skip too, but never silently in CI:
# with CI set, a missing apt or a failed install is an error.
set -euo pipefail

NAME=$1
PURPOSE=$2
shift 2
PACKAGES=("$@")

installed() {
  local p
  for p in "${PACKAGES[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || return 1
  done
}

if command -v dpkg-query >/dev/null && installed; then
  exit 0
fi

if ! command -v apt-get >/dev/null; then
  if [ -n "${CI:-}" ]; then
    echo "$NAME: CI is set but apt-get is missing: cannot install ${PACKAGES[*]}" >&2
    exit 1
  fi
  echo "$NAME: no apt-get here: ${PACKAGES[*]} not installed, $PURPOSE will skip" >&2
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    SUDO=(sudo -n)
  else
    echo "$NAME: not root and no sudo: cannot install ${PACKAGES[*]}" >&2
    exit 1
  fi
fi

echo "== installing ${PACKAGES[*]} (Debian packages, for $PURPOSE)"
export DEBIAN_FRONTEND=noninteractive
# Try from the cached package lists first; refresh them once only when that fails.
if ! "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null; then
  "${SUDO[@]}" apt-get update -q >/dev/null
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null
fi
# Packages that ship services of their own: the tests run their own instances on other
# ports, so the packaged ones are not needed (policy-rc.d usually keeps them stopped).
installed
