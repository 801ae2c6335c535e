#!/usr/bin/env bash
# What the pooler tests need: Debian's pgbouncer (1.18 on bookworm: no prepared statements
# in transaction mode, which is what the tests want to face).
exec "$(dirname "$0")/install_debian_packages.sh" install_pgbouncer "the PgBouncer tests" \
  pgbouncer
