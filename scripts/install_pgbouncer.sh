#!/usr/bin/env bash
# Install what the pooler tests need: Debian's pgbouncer (1.18 on bookworm: no prepared
# statements in transaction mode, which is what the tests want to face).
#
# Idempotent and fast once installed (a dpkg query, no network). Where apt is not
# available it skips with a message and the PgBouncer tests skip too, but never silently in
# CI: with CI set, a missing apt or a failed install is an error.
set -euo pipefail

PACKAGES=(pgbouncer)

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
    echo "install_pgbouncer: CI is set but apt-get is missing: cannot install ${PACKAGES[*]}" >&2
    exit 1
  fi
  echo "install_pgbouncer: no apt-get here: ${PACKAGES[*]} not installed, the PgBouncer tests will skip" >&2
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    SUDO=(sudo -n)
  else
    echo "install_pgbouncer: not root and no sudo: cannot install ${PACKAGES[*]}" >&2
    exit 1
  fi
fi

echo "== installing ${PACKAGES[*]} (Debian package, for the PgBouncer tests)"
export DEBIAN_FRONTEND=noninteractive
# Try from the cached package lists first; refresh them once only when that fails.
if ! "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null; then
  "${SUDO[@]}" apt-get update -q >/dev/null
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null
fi
# The package ships a service of its own; the tests run their own instances on other
# ports, so the packaged one is not needed (policy-rc.d usually keeps it stopped).
installed
