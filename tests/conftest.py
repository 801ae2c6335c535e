"""Test fixtures: a real PostgreSQL started for the run, real gRPC servers on loopback."""

from __future__ import annotations

import os

# The test process starts many child processes (services, PostgreSQL, Patroni, etcd) while
# its own gRPC channels and servers run. gRPC's fork handlers restart its poller in a
# forked child before the child execs, and a child caught in them once never reached exec
# (a Patroni node that never started). The tests never use gRPC in a forked child: off.
# Read when grpc is first imported, hence before any import below.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import psycopg
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.common.grpc_server import bind, create_server
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.servicer import StateServicer
from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.memory import MemoryStore
from agentstate.state_service.storage.postgres import PostgresStore
from tests.support.agent_harness import Stack
from tests.support.state_process import StateServices, on_postgres
from tests.support.telemetry_tools import install_in_memory

TEST_MAX_PAYLOAD_BYTES = 1024 * 1024


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--docs-screenshot",
        default="",
        help="also save the console's screenshot for the docs here (./run docs)",
    )


@pytest.fixture
def world_traversable_dir() -> Iterator[Path]:
    """A temporary directory the unprivileged `postgres` user can reach (pytest's are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="agentstate-test-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    """One throwaway PostgreSQL server for the whole run."""
    root = Path(tempfile.mkdtemp(prefix="agentstate-test-"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "pgdata")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def create_database(postgres: EmbeddedPostgres, name: str) -> str:
    """(Re)create an empty database and return its connection string."""
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return postgres.dsn.replace("dbname=postgres", f"dbname={name}")


@pytest.fixture(scope="session")
def database_url(postgres: EmbeddedPostgres) -> str:
    return create_database(postgres, "agentstate_test")


@pytest.fixture
async def pg_store(database_url: str) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(database_url, min_size=1, max_size=30)
    await store.open()
    yield store
    await store.close()


@pytest.fixture(params=["memory", "postgres"])
async def store(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[StateStore]:
    """Each behavioural test runs against both stores."""
    if request.param == "memory":
        yield MemoryStore()
        return
    pg = PostgresStore(database_url, min_size=1, max_size=30)
    await pg.open()
    yield pg
    await pg.close()


async def start_state_server(store: StateStore) -> tuple[grpc.aio.Server, str]:
    server = create_server(max_message_bytes=4 * TEST_MAX_PAYLOAD_BYTES)
    pb_grpc.add_StateServiceServicer_to_server(
        StateServicer(store, max_payload_bytes=TEST_MAX_PAYLOAD_BYTES), server
    )
    address = bind(server, "127.0.0.1:0")
    await server.start()
    return server, address


@pytest.fixture
async def state_address(store: StateStore) -> AsyncIterator[str]:
    """The address of a real StateService on 127.0.0.1 over the parametrised store."""
    server, address = await start_state_server(store)
    yield address
    await server.stop(None)


@pytest.fixture
async def state_stub(store: StateStore) -> AsyncIterator[pb_grpc.StateServiceAsyncStub]:
    """A real StateService on 127.0.0.1 over the parametrised store."""
    server, address = await start_state_server(store)
    async with grpc.aio.insecure_channel(address) as channel:
        yield pb_grpc.StateServiceStub(channel)
    await server.stop(None)


@pytest.fixture
def user_id() -> str:
    return f"user-{uuid.uuid4()}"


@pytest.fixture
def other_user_id() -> str:
    return f"other-{uuid.uuid4()}"


@pytest.fixture(scope="session")
def orders_database_url(postgres: EmbeddedPostgres) -> str:
    """The demo order system's own database (never the state service's)."""
    return create_database(postgres, "orders_agent_test")


@pytest.fixture
async def stack(database_url: str, orders_database_url: str) -> AsyncIterator[Stack]:
    """A state service on PostgreSQL and one agent replica, in this process, on loopback."""
    running = Stack(database_url, orders_database_url)
    await running.start_state()
    await running.start_agent()
    yield running
    await running.close()


@pytest.fixture
def telemetry() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    exporter, reader = install_in_memory()
    exporter.clear()
    return exporter, reader


@pytest.fixture
async def traced_stack(
    telemetry: tuple[InMemorySpanExporter, InMemoryMetricReader],
    database_url: str,
    orders_database_url: str,
) -> AsyncIterator[Stack]:
    """A stack whose spans land in `telemetry`. Lease renewals are slowed down so that
    a turn's trace holds only the state calls the turn itself makes."""
    # Started after the providers are installed, so the interceptors are in place.
    running = Stack(database_url, orders_database_url, lease_renew_seconds=5)
    await running.start_state()
    await running.start_agent()
    yield running
    await running.close()


@pytest.fixture
def state_services() -> Iterator[StateServices]:
    """Starts state-service processes for one test and stops them at its end (SIGTERM;
    each still running must exit 0)."""
    with StateServices() as services:
        yield services


@pytest.fixture(scope="module")
def state_process_address(database_url: str) -> Iterator[str]:
    """A state service as its own process (`python -m agentstate.state_service`), for
    clients in other languages; one per test module."""
    with StateServices() as services:
        yield services.serve(on_postgres(database_url))


@pytest.fixture(scope="module")
def agent_process_address(state_process_address: str, orders_database_url: str) -> Iterator[str]:
    """An agent service process with the order demo profile, on `state_process_address`."""
    service = ServiceProcess(
        "agentstate.agent_service",
        {
            "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
            "AGENT_AUTH_MODE": "dev-header",
            "AGENT_STATE_ADDRESS": state_process_address,
            "AGENT_PROFILE": "order_demo",
            "ORDERS_DATABASE_URL": orders_database_url,
            "AGENT_LEASE_RENEW_SECONDS": "0.2",
        },
    )
    address = service.wait_ready()
    yield address
    assert service.terminate() == 0, service.output
