"""Failover of a Patroni cluster under 8 compare-and-set writers, measured round by round.

Starts the cluster of tests/support/patroni_cluster.py (1 etcd + 3 PostgreSQL nodes, synchronous
mode strict) and one state service process on its multi-host URL; then, each round,
runs the writers of tests/support/ha_failover.py, kills -9 the primary's postmaster, waits for
the writes to come back, checks every acknowledged write against the final states, and
waits for the old primary to rejoin as a replica before the next round. One service
process serves every round.

    .venv/bin/python -m bench.ha_failover [--rounds 3]

Needs Debian's patroni and etcd-server (scripts/install_ha_deps.sh). Results are
recorded in docs/ha.md.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from agentstate.dev.processes import ServiceProcess
from tests.support.ha_failover import run_failover
from tests.support.patroni_cluster import PatroniCluster, missing_tools


async def rounds(count: int) -> None:
    started = time.monotonic()
    with PatroniCluster.create() as cluster:
        cluster.start()
        print(f"cluster up in {time.monotonic() - started:.1f}s", flush=True)
        service = ServiceProcess(
            "agentstate.state_service",
            {
                "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
                "STATE_STORE": "postgres",
                "DATABASE_URL": cluster.database_url(),
            },
        )
        try:
            address = service.wait_ready()
            for round_no in range(1, count + 1):
                report = await run_failover(cluster, address)
                print(f"round {round_no}:", flush=True)
                for key, value in report.summary().items():
                    print(f"  {key}: {value}", flush=True)
                rejoined = await asyncio.to_thread(
                    cluster.wait_for, cluster.healthy, 120, "the old primary back as a replica"
                )
                print(f"  old primary rejoined, cluster healthy {rejoined:.1f}s later")
            print(f"service process still the same: {service.proc.poll() is None}")
        finally:
            service.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    missing = missing_tools()
    if missing:
        raise SystemExit(f"missing: {', '.join(missing)} (run scripts/install_ha_deps.sh)")
    asyncio.run(rounds(args.rounds))


if __name__ == "__main__":
    main()
