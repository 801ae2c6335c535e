#!/usr/bin/env bash
# What the high-availability test needs: Debian's patroni and etcd-server.
exec "$(dirname "$0")/install_debian_packages.sh" install_ha_deps "the Patroni HA test" \
  patroni etcd-server
