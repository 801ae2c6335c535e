"""One error vocabulary: every reason the state service can send is a domain error class's
own (state_service/domain/errors.py), is documented in docs/reference/errors.md, and is
produced by a real call somewhere in the suite with its ErrorInfo checked."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import TypeAlias

import grpc
import psycopg
import pytest

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service import domain as d
from agentstate.state_service.storage.base import Feature, StateStore
from agentstate.state_service.storage.memory.conversations import MemoryConversations
from agentstate.state_service.storage.memory.leases import MemoryLeases
from agentstate.state_service.storage.memory.lifecycle import MemoryLifecycle
from agentstate.state_service.storage.memory.messages import MemoryMessages
from agentstate.state_service.storage.memory.states import MemoryStates
from agentstate.state_service.storage.postgres import PostgresStore
from tests.conftest import create_database, start_state_server
from tests.state_service.test_error_details import error_info
from tests.support.helpers import expect_rpc_error, new_conversation, put_state
from tests.support.paths import REPO, TESTS

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"
# Sent before a handler runs (the shared request decoding, admission control), not by a
# domain error.
INTERCEPTOR_REASONS = {"MALFORMED_REQUEST", "OVERLOADED"}
# PERMISSION_DENIED and CALLER_UNAUTHENTICATED are domain errors the caller interceptor
# sends (state_service/callers.py); tests/state_service/test_transport_security.py reads them.


def _documented() -> dict[str, str]:
    """reason -> the 'when' column, from docs/reference/errors.md's table."""
    table = (REPO / "docs" / "reference" / "errors.md").read_text()
    found: dict[str, str] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            for reason in re.findall(r"`([A-Z_]+)`", cells[0]):
                found[reason] = cells[3]
    return found


def _domain_reasons() -> set[str]:
    classes: list[type[d.StateServiceError]] = [d.StateServiceError]
    reasons = set()
    while classes:
        kind = classes.pop()
        reasons.add(kind.reason)
        classes.extend(kind.__subclasses__())
    return reasons


def _asserted_in_tests() -> set[str]:
    """Reasons some test reads from a real call's ErrorInfo."""
    pattern = re.compile(r'(?:error_info\([^)]*\) == \(\s*|reason == )"([A-Z_]+)"')
    found: set[str] = set()
    for path in TESTS.rglob("test_*.py"):
        found.update(pattern.findall(path.read_text()))
    return found


def test_every_domain_reason_is_documented() -> None:
    missing = _domain_reasons() - set(_documented())
    assert missing == set(), f"reasons sent but not in docs/reference/errors.md: {missing}"


def test_every_documented_state_reason_is_sent_and_tested() -> None:
    documented = {r for r, when in _documented().items() if not when.startswith("agent")}
    # STORE_UNAVAILABLE / UNAVAILABLE and STORE_ERROR / INTERNAL share a row with the agent's.
    state_reasons = documented - {"UNAVAILABLE", "INTERNAL", "FAILED_PRECONDITION"}
    assert state_reasons - _domain_reasons() - INTERCEPTOR_REASONS == set()
    assert state_reasons - _asserted_in_tests() == set()


async def test_a_delta_on_a_context_that_is_not_an_array(state_stub: Stub, user_id: str) -> None:
    """Was MESSAGE_STATUS_MISMATCH (a table keyed by RPC name); the state stays."""
    cid = await new_conversation(state_stub, user_id)
    await put_state(state_stub, user_id, cid, {"context": "not a list"}, expected_version=0)
    delta = pb.StateDelta(base_version=1, messages=[b'{"role": "user"}'])
    for call in (
        state_stub.UpsertState(
            pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, delta=delta)
        ),
        state_stub.EndTurn(
            pb.EndTurnRequest(user_id=user_id, conversation_id=cid, task_id="1", delta=delta)
        ),
    ):
        error = await expect_rpc_error(call, grpc.StatusCode.FAILED_PRECONDITION, "not an array")
        assert error_info(error) == ("CONTEXT_NOT_ARRAY", {})
    got = await state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid))
    assert got.version == 1 and b"not a list" in got.payload


class _CoreOnlyStore(
    MemoryConversations, MemoryStates, MemoryMessages, MemoryLeases, MemoryLifecycle, StateStore
):
    """A backend with the core aggregates and no capabilities."""


@pytest.fixture
async def core_only_stub() -> AsyncIterator[Stub]:
    store = _CoreOnlyStore()
    assert store.features() == frozenset()
    server, address = await start_state_server(store)
    async with grpc.aio.insecure_channel(address) as channel:
        yield pb_grpc.StateServiceStub(channel)
    await server.stop(None)


async def test_a_capability_the_store_lacks_is_unimplemented(
    core_only_stub: Stub, user_id: str
) -> None:
    cid = await new_conversation(core_only_stub, user_id)  # the core works
    for call, feature in (
        (
            core_only_stub.ListItems(pb.ListItemsRequest(user_id=user_id, conversation_id=cid)),
            Feature.ITEMS,
        ),
        (
            core_only_stub.GetCheckpoint(
                pb.GetCheckpointRequest(user_id=user_id, conversation_id=cid)
            ),
            Feature.CHECKPOINTS,
        ),
    ):
        error = await expect_rpc_error(call, grpc.StatusCode.UNIMPLEMENTED, feature.value)
        assert error_info(error) == ("NOT_SUPPORTED", {})


async def test_the_database_failing_or_gone(postgres: EmbeddedPostgres, user_id: str) -> None:
    """STORE_ERROR for a failure the caller cannot fix (here a table gone from under the
    service), STORE_UNAVAILABLE once the database cannot be reached."""
    name = f"broken_{uuid.uuid4().hex[:8]}"
    dsn = create_database(postgres, name)
    store = PostgresStore(dsn, min_size=1, max_size=2, timeout=1.0)
    await store.open()
    server, address = await start_state_server(store)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.StateServiceStub(channel)
            cid = await new_conversation(stub, user_id)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("ALTER TABLE t_agent_state RENAME TO t_agent_state_gone")
            failed = await expect_rpc_error(
                stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)),
                grpc.StatusCode.INTERNAL,
                "nothing was changed",
            )
            assert error_info(failed) == ("STORE_ERROR", {})
            with psycopg.connect(postgres.dsn, autocommit=True) as conn:
                conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
            unavailable = await expect_rpc_error(
                stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)),
                grpc.StatusCode.UNAVAILABLE,
            )
            assert error_info(unavailable) == ("STORE_UNAVAILABLE", {})
    finally:
        await server.stop(None)
        await store.close()
