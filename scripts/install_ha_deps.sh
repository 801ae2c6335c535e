#!/usr/bin/env bash
# Install what the high-availability test needs: Debian's patroni and etcd-server.
#
# Idempotent and fast once installed (a dpkg query, no network). Where apt is not
# available it skips with a message and the HA test skips too, but never silently in
# CI: with CI set, a missing apt or a failed install is an error.
set -euo pipefail

PACKAGES=(patroni etcd-server)

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
    echo "install_ha_deps: CI is set but apt-get is missing: cannot install ${PACKAGES[*]}" >&2
    exit 1
  fi
  echo "install_ha_deps: no apt-get here: ${PACKAGES[*]} not installed, the HA test will skip" >&2
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    SUDO=(sudo -n)
  else
    echo "install_ha_deps: not root and no sudo: cannot install ${PACKAGES[*]}" >&2
    exit 1
  fi
fi

echo "== installing ${PACKAGES[*]} (Debian packages, for the Patroni HA test)"
export DEBIAN_FRONTEND=noninteractive
# Try from the cached package lists first; refresh them once only when that fails.
if ! "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null; then
  "${SUDO[@]}" apt-get update -q >/dev/null
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null
fi
# The packages ship services of their own; the test runs its own instances on other
# ports, so the packaged ones are not needed (policy-rc.d usually keeps them stopped).
installed
