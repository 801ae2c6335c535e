"""Checkpoint RPCs (issue 15) through real gRPC, against both stores.

A conversation's checkpoint history: put with compare-and-set on the namespace's
head, get/list with values and pending writes, idempotent writes, delete by run,
copy, prune, and deletion with the conversation (no resurrection).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import TypeAlias

import grpc

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service import domain as d
from agentstate.state_service.storage.postgres import PostgresStore
from tests.conftest import TEST_MAX_PAYLOAD_BYTES
from tests.state_service.test_error_details import error_info
from tests.support.helpers import expect_rpc_error, new_conversation

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
ABORTED = grpc.StatusCode.ABORTED


def put_request(
    user_id: str,
    conversation_id: str,
    checkpoint_id: str,
    *,
    parent: str = "",
    namespace: str = "",
    expected_head: str | None = None,
    metadata: dict[str, object] | None = None,
    values: dict[str, tuple[str, bytes]] | None = None,
    versions: dict[str, str] | None = None,
) -> pb.PutCheckpointRequest:
    new_values = [
        pb.ChannelValue(channel=ch, version=ver, value_type="json", value=val)
        for ch, (ver, val) in (values or {}).items()
    ]
    request = pb.PutCheckpointRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        namespace=namespace,
        checkpoint_id=checkpoint_id,
        parent_checkpoint_id=parent,
        checkpoint_type="json",
        checkpoint=json.dumps({"id": checkpoint_id}).encode(),
        metadata_json=json.dumps(metadata or {"step": 0}).encode(),
        channel_versions=versions or {ch: ver for ch, (ver, _) in (values or {}).items()},
        new_channel_values=new_values,
    )
    if expected_head is not None:
        request.expected_head_checkpoint_id = expected_head
    return request


async def get(
    stub: Stub, user_id: str, cid: str, checkpoint_id: str = "", namespace: str = ""
) -> pb.Checkpoint | None:
    response = await stub.GetCheckpoint(
        pb.GetCheckpointRequest(
            user_id=user_id, conversation_id=cid, namespace=namespace, checkpoint_id=checkpoint_id
        )
    )
    return response.checkpoint if response.HasField("checkpoint") else None


async def ids(stub: Stub, user_id: str, cid: str, **kwargs: object) -> list[str]:
    response = await stub.ListCheckpoints(
        pb.ListCheckpointsRequest(user_id=user_id, conversation_id=cid, **kwargs)  # type: ignore[arg-type]
    )
    return [c.checkpoint_id for c in response.checkpoints]


async def test_put_get_values_and_head_compare_and_set(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    assert await get(state_stub, user_id, cid) is None
    await state_stub.PutCheckpoint(
        put_request(user_id, cid, "c1", expected_head="", values={"a": ("1", b'"v1"')})
    )
    # A second "create only" writer is refused: the namespace is not empty any more.
    refused = await expect_rpc_error(
        state_stub.PutCheckpoint(put_request(user_id, cid, "c1b", expected_head="")),
        ABORTED,
        "another writer",
    )
    assert error_info(refused) == (
        "CHECKPOINT_CONFLICT",
        {"current_checkpoint_id": "c1", "expected_checkpoint_id": ""},
    )
    # Only channel "a" changes; "b" is new; the value of a at version 1 stays stored.
    await state_stub.PutCheckpoint(
        put_request(
            user_id,
            cid,
            "c2",
            parent="c1",
            expected_head="c1",
            values={"a": ("2", b'"v2"'), "b": ("1", b'"b1"')},
        )
    )
    # A stale writer that also extends c1 is refused and stores nothing.
    await expect_rpc_error(
        state_stub.PutCheckpoint(
            put_request(
                user_id, cid, "c2x", parent="c1", expected_head="c1", values={"a": ("9", b"x")}
            )
        ),
        ABORTED,
        "it is checkpoint c2",
    )
    latest = await get(state_stub, user_id, cid)
    assert latest is not None and latest.checkpoint_id == "c2"
    assert latest.parent_checkpoint_id == "c1"
    assert {v.channel: v.value for v in latest.channel_values} == {"a": b'"v2"', "b": b'"b1"'}
    first = await get(state_stub, user_id, cid, "c1")
    assert first is not None and {v.channel: v.value for v in first.channel_values} == {
        "a": b'"v1"'
    }
    assert await ids(state_stub, user_id, cid) == ["c2", "c1"]
    # Re-putting a stored id (a retried call) replaces it without the head check.
    await state_stub.PutCheckpoint(
        put_request(user_id, cid, "c1", expected_head="zzz", metadata={"step": 7})
    )
    again = await get(state_stub, user_id, cid, "c1")
    assert again is not None and json.loads(again.metadata_json) == {"step": 7}


async def test_writes_are_idempotent_and_special_ones_replace(
    state_stub: Stub, user_id: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    await state_stub.PutCheckpoint(put_request(user_id, cid, "c1"))

    def writes(value: bytes) -> pb.PutCheckpointWritesRequest:
        return pb.PutCheckpointWritesRequest(
            user_id=user_id,
            conversation_id=cid,
            checkpoint_id="c1",
            writes=[
                pb.CheckpointWrite(task_id="t1", idx=0, channel="ch", value=value),
                pb.CheckpointWrite(task_id="t1", idx=-3, channel="__interrupt__", value=value),
            ],
        )

    assert (await state_stub.PutCheckpointWrites(writes(b"1"))).writes_stored == 2
    assert (await state_stub.PutCheckpointWrites(writes(b"2"))).writes_stored == 1
    stored = await get(state_stub, user_id, cid)
    assert stored is not None
    assert [(w.task_id, w.idx, w.channel, w.value) for w in stored.pending_writes] == [
        ("t1", -3, "__interrupt__", b"2"),
        ("t1", 0, "ch", b"1"),
    ]


async def test_list_filters_pages_and_namespaces(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    parent = ""
    for i in range(5):
        await state_stub.PutCheckpoint(
            put_request(
                user_id,
                cid,
                f"c{i}",
                parent=parent,
                expected_head=parent,
                metadata={"step": i, "source": "input" if i % 2 == 0 else "loop"},
            )
        )
        parent = f"c{i}"
    await state_stub.PutCheckpoint(put_request(user_id, cid, "c9", namespace="child:1"))
    assert await ids(state_stub, user_id, cid) == ["c9", "c4", "c3", "c2", "c1", "c0"]
    assert await ids(state_stub, user_id, cid, namespace="") == ["c4", "c3", "c2", "c1", "c0"]
    assert await ids(state_stub, user_id, cid, namespace="", before_checkpoint_id="c3") == [
        "c2",
        "c1",
        "c0",
    ]
    assert await ids(state_stub, user_id, cid, metadata_filter_json=b'{"source": "input"}') == [
        "c4",
        "c2",
        "c0",
    ]
    assert await ids(state_stub, user_id, cid, metadata_filter_json=b'{"step": 3}') == ["c3"]
    pages: list[str] = []
    token = ""
    while True:
        response = await state_stub.ListCheckpoints(
            pb.ListCheckpointsRequest(
                user_id=user_id, conversation_id=cid, page_size=2, page_token=token
            )
        )
        pages.append(",".join(c.checkpoint_id for c in response.checkpoints))
        token = response.next_page_token
        if not token:
            break
    assert pages == ["c9,c4", "c3,c2", "c1,c0"]


async def test_delete_for_runs_copy_and_prune(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    other = await new_conversation(state_stub, user_id)
    for i, run in enumerate(["r1", "r2", "r3"]):
        await state_stub.PutCheckpoint(
            put_request(
                user_id,
                cid,
                f"c{i}",
                parent=f"c{i - 1}" if i else "",
                metadata={"run_id": run},
                values={"x": (str(i), str(i).encode())},
            )
        )
    await state_stub.PutCheckpoint(put_request(user_id, other, "o1", metadata={"run_id": "r1"}))
    await state_stub.PutCheckpointWrites(
        pb.PutCheckpointWritesRequest(
            user_id=user_id,
            conversation_id=cid,
            checkpoint_id="c0",
            writes=[pb.CheckpointWrite(task_id="t", idx=0, channel="ch", value=b"v")],
        )
    )
    deleted = await state_stub.DeleteCheckpointsForRuns(
        pb.DeleteCheckpointsForRunsRequest(user_id=user_id, run_ids=["r1", "nope"])
    )
    assert deleted.checkpoints_deleted == 2  # across both conversations
    assert await ids(state_stub, user_id, cid) == ["c2", "c1"]
    assert await ids(state_stub, user_id, other) == []

    target = await new_conversation(state_stub, user_id)
    copied = await state_stub.CopyCheckpoints(
        pb.CopyCheckpointsRequest(
            user_id=user_id, source_conversation_id=cid, target_conversation_id=target
        )
    )
    assert copied.checkpoints_copied == 2
    assert await ids(state_stub, user_id, target) == ["c2", "c1"]
    merged = await expect_rpc_error(
        state_stub.CopyCheckpoints(
            pb.CopyCheckpointsRequest(
                user_id=user_id, source_conversation_id=cid, target_conversation_id=target
            )
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "already has checkpoints",
    )
    assert error_info(merged) == ("TARGET_HAS_CHECKPOINTS", {})

    pruned = await state_stub.PruneCheckpoints(
        pb.PruneCheckpointsRequest(
            user_id=user_id,
            conversation_ids=[cid],
            strategy=pb.PRUNE_STRATEGY_KEEP_LATEST,
        )
    )
    assert pruned.checkpoints_deleted == 1
    kept = await get(state_stub, user_id, cid)
    assert kept is not None and kept.checkpoint_id == "c2"
    assert [v.value for v in kept.channel_values] == [b"2"]
    # All or nothing: an absent conversation in the batch prunes nothing.
    await expect_rpc_error(
        state_stub.PruneCheckpoints(
            pb.PruneCheckpointsRequest(
                user_id=user_id,
                conversation_ids=[target, "123"],
                strategy=pb.PRUNE_STRATEGY_DELETE_ALL,
            )
        ),
        NOT_FOUND,
        "nothing was pruned",
    )
    assert await ids(state_stub, user_id, target) == ["c2", "c1"]
    await state_stub.PruneCheckpoints(
        pb.PruneCheckpointsRequest(
            user_id=user_id, conversation_ids=[target], strategy=pb.PRUNE_STRATEGY_DELETE_ALL
        )
    )
    assert await ids(state_stub, user_id, target) == []


async def test_deleted_with_the_conversation_and_never_resurrected(
    state_stub: Stub, user_id: str, other_user_id: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    await state_stub.PutCheckpoint(put_request(user_id, cid, "c1", values={"a": ("1", b"x")}))
    # Another user sees nothing and can write nothing.
    await expect_rpc_error(get(state_stub, other_user_id, cid), NOT_FOUND)
    await expect_rpc_error(
        state_stub.PutCheckpoint(put_request(other_user_id, cid, "c2")), NOT_FOUND
    )
    await state_stub.DeleteConversation(
        pb.DeleteConversationRequest(user_id=user_id, conversation_id=cid)
    )
    await expect_rpc_error(get(state_stub, user_id, cid), NOT_FOUND)
    await expect_rpc_error(
        state_stub.PutCheckpoint(put_request(user_id, cid, "c2", parent="c1")), NOT_FOUND
    )
    await expect_rpc_error(
        state_stub.PutCheckpointWrites(
            pb.PutCheckpointWritesRequest(
                user_id=user_id,
                conversation_id=cid,
                checkpoint_id="c1",
                writes=[pb.CheckpointWrite(task_id="t", idx=0, channel="c")],
            )
        ),
        NOT_FOUND,
    )


async def test_writes_of_a_checkpoint_not_stored_are_refused_and_store_nothing(
    state_stub: Stub, user_id: str
) -> None:
    """Pending writes always belong to a stored checkpoint: writes for one never stored
    (its put was refused, or has not arrived yet) are refused, in either namespace, and
    the writes of the stored checkpoint are untouched."""
    cid = await new_conversation(state_stub, user_id)
    await state_stub.PutCheckpoint(put_request(user_id, cid, "c1"))

    def writes(checkpoint_id: str, namespace: str = "") -> pb.PutCheckpointWritesRequest:
        return pb.PutCheckpointWritesRequest(
            user_id=user_id,
            conversation_id=cid,
            namespace=namespace,
            checkpoint_id=checkpoint_id,
            writes=[pb.CheckpointWrite(task_id="t", idx=0, channel="ch", value=b"v")],
        )

    await state_stub.PutCheckpointWrites(writes("c1"))
    for request in (writes("c2"), writes("c1", namespace="sub")):
        refused = await expect_rpc_error(
            state_stub.PutCheckpointWrites(request),
            grpc.StatusCode.FAILED_PRECONDITION,
            "is not stored",
        )
        assert error_info(refused) == ("CHECKPOINT_NOT_STORED", {})
        assert "nothing was stored" in (refused.details() or "")
    # A put refused by its compare-and-set stores nothing, so its writes are refused too.
    await expect_rpc_error(
        state_stub.PutCheckpoint(put_request(user_id, cid, "c3", expected_head="c0")), ABORTED
    )
    await expect_rpc_error(
        state_stub.PutCheckpointWrites(writes("c3")), grpc.StatusCode.FAILED_PRECONDITION
    )
    stored = await get(state_stub, user_id, cid, "c1")
    assert stored is not None
    assert [(w.task_id, w.channel, w.value) for w in stored.pending_writes] == [("t", "ch", b"v")]
    # Once the checkpoint is stored, the same writes are accepted.
    await state_stub.PutCheckpoint(put_request(user_id, cid, "c2", parent="c1"))
    assert (await state_stub.PutCheckpointWrites(writes("c2"))).writes_stored == 1


async def test_concurrent_writers_of_one_head_one_wins(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await state_stub.PutCheckpoint(put_request(user_id, cid, "c0", expected_head=""))
    results = await asyncio.gather(
        *(
            state_stub.PutCheckpoint(
                put_request(user_id, cid, f"c1-{i}", parent="c0", expected_head="c0")
            )
            for i in range(8)
        ),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(refused) == 7 and all(r.code() == ABORTED for r in refused)
    assert len(await ids(state_stub, user_id, cid)) == 2


async def test_bad_checkpoint_input(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await expect_rpc_error(state_stub.PutCheckpoint(put_request(user_id, cid, "")), INVALID)
    await expect_rpc_error(
        state_stub.PutCheckpoint(put_request(user_id, cid, "a\x00b")), INVALID, "NUL"
    )
    bad_metadata = put_request(user_id, cid, "c1")
    bad_metadata.metadata_json = b"[1]"
    await expect_rpc_error(state_stub.PutCheckpoint(bad_metadata), INVALID, "metadata_json")
    not_json = put_request(user_id, cid, "c1")
    not_json.metadata_json = b'{"a": tru}'
    await expect_rpc_error(state_stub.PutCheckpoint(not_json), INVALID, "metadata_json")
    too_big = put_request(user_id, cid, "c1", values={"a": ("1", b"x" * TEST_MAX_PAYLOAD_BYTES)})
    await expect_rpc_error(
        state_stub.PutCheckpoint(too_big), grpc.StatusCode.RESOURCE_EXHAUSTED, "over the limit"
    )
    await expect_rpc_error(
        state_stub.ListCheckpoints(
            pb.ListCheckpointsRequest(user_id=user_id, conversation_id=cid, page_token="%%%")
        ),
        INVALID,
        "page_token",
    )
    await expect_rpc_error(
        state_stub.PruneCheckpoints(
            pb.PruneCheckpointsRequest(user_id=user_id, conversation_ids=[cid])
        ),
        INVALID,
        "strategy",
    )
    # Nothing of the refused puts was stored.
    assert await ids(state_stub, user_id, cid) == []


async def test_postgres_rows_go_with_the_conversation(pg_store: PostgresStore) -> None:
    """Delete and retention remove checkpoint rows in their one transaction (ON DELETE
    CASCADE), so no table of checkpoint data keeps rows of a deleted conversation."""
    user = f"user-{uuid.uuid4()}"
    kept, deleted, purged = [
        (await pg_store.create_conversation(user_id=user, title="t")).conversation_id
        for _ in range(3)
    ]
    for cid in (kept, deleted, purged):
        await pg_store.put_checkpoint(
            user_id=user,
            conversation_id=cid,
            checkpoint=d.NewCheckpoint(
                "",
                "c1",
                None,
                "json",
                b"{}",
                b"{}",
                {"a": "1"},
                (d.ChannelValue("a", "1", "json", b"1"),),
            ),
            expected_head="",
        )
        await pg_store.put_checkpoint_writes(
            user_id=user,
            conversation_id=cid,
            namespace="",
            checkpoint_id="c1",
            writes=[d.CheckpointWrite("t", 0, "a", "json", b"2")],
        )
    await pg_store.delete_conversations(user_id=user, conversation_ids=[deleted])
    async with pg_store.pool.connection() as conn:
        await conn.execute(
            "UPDATE t_conversation SET update_time = now() - interval '2 days' WHERE id = %s",
            (purged,),
        )
    await pg_store.purge_inactive(before=datetime.now(UTC) - timedelta(days=1))

    async with pg_store.pool.connection() as conn:
        for table in ("t_checkpoint", "t_checkpoint_blob", "t_checkpoint_write"):
            cur = await conn.execute(
                f"SELECT conversation_id FROM {table} WHERE user_id = %s", (user,)
            )
            assert [row["conversation_id"] for row in await cur.fetchall()] == [kept], table


async def test_put_carries_parent_writes_and_the_run_lease_in_one_transaction(
    state_stub: Stub, user_id: str
) -> None:
    """A step in one call (issue 22): PutCheckpoint stores the parent's pending writes and
    takes, renews or releases the run lease with the checkpoint. On any refusal (the
    lease held by another, the head moved, the parent not stored, a lost lease) nothing
    of it is stored and the lease is as it was."""
    cid = await new_conversation(state_stub, user_id)
    lease_of = pb.GetLeaseRequest(user_id=user_id, conversation_id=cid)

    def step(
        checkpoint_id: str, parent: str, writes: list[str], lease: pb.CheckpointRunLease | None
    ) -> pb.PutCheckpointRequest:
        request = put_request(user_id, cid, checkpoint_id, parent=parent, expected_head=parent)
        request.parent_writes.extend(
            pb.CheckpointWrite(task_id="t", idx=i, channel=ch, value=ch.encode())
            for i, ch in enumerate(writes)
        )
        if lease is not None:
            request.run_lease.CopyFrom(lease)
        return request

    taken = await state_stub.PutCheckpoint(
        step("c1", "", [], pb.CheckpointRunLease(holder="run-a", ttl_ms=60_000))
    )
    task = taken.lease.task_id
    assert task and taken.lease.holder == "run-a"
    held = await state_stub.GetLease(lease_of)
    assert held.lease.task_id == task

    # Another holder's put is refused while the lease runs: nothing stored.
    refused = await expect_rpc_error(
        state_stub.PutCheckpoint(
            step("c2-b", "c1", ["b"], pb.CheckpointRunLease(holder="run-b", ttl_ms=60_000))
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert error_info(refused)[0] == "LEASE_HELD"
    assert await ids(state_stub, user_id, cid) == ["c1"]

    # The step: c1's writes with c2, the lease renewed.
    renewed = await state_stub.PutCheckpoint(
        step("c2", "c1", ["x", "y"], pb.CheckpointRunLease(task_id=task, ttl_ms=90_000))
    )
    assert renewed.lease.task_id == task
    stored = await get(state_stub, user_id, cid, "c1")
    assert stored is not None
    assert [(w.idx, w.channel) for w in stored.pending_writes] == [(0, "x"), (1, "y")]
    # A head that moved refuses the writes with the put.
    await expect_rpc_error(state_stub.PutCheckpoint(step("c3-old", "c1", ["z"], None)), ABORTED)
    stored = await get(state_stub, user_id, cid, "c1")
    assert stored is not None and len(stored.pending_writes) == 2
    # A parent that is not stored refuses it all.
    orphan = step("c3-orphan", "c-none", ["z"], None)
    orphan.ClearField("expected_head_checkpoint_id")
    refused = await expect_rpc_error(
        state_stub.PutCheckpoint(orphan), grpc.StatusCode.FAILED_PRECONDITION, "is not stored"
    )
    assert error_info(refused) == ("CHECKPOINT_NOT_STORED", {})
    # The run's last put releases the lease.
    last = await state_stub.PutCheckpoint(
        step("c3", "c2", ["w"], pb.CheckpointRunLease(task_id=task, release=True))
    )
    assert not last.HasField("lease")
    assert not (await state_stub.GetLease(lease_of)).HasField("lease")
    assert await ids(state_stub, user_id, cid) == ["c3", "c2", "c1"]
    # Renewing a lease that is gone is refused, and stores nothing.
    lost = await expect_rpc_error(
        state_stub.PutCheckpoint(
            step("c4", "c3", ["v"], pb.CheckpointRunLease(task_id=task, ttl_ms=60_000))
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "lost",
    )
    assert error_info(lost)[0] == "LEASE_LOST"
    assert await ids(state_stub, user_id, cid) == ["c3", "c2", "c1"]
    stored = await get(state_stub, user_id, cid, "c3")
    assert stored is not None and stored.pending_writes == []
    # Taken and released by one put (a run of one checkpoint).
    await state_stub.PutCheckpoint(
        step("c4", "c3", [], pb.CheckpointRunLease(holder="run-c", ttl_ms=1000, release=True))
    )
    assert not (await state_stub.GetLease(lease_of)).HasField("lease")

    # Bad input: writes without a parent, a lease without holder or action, too many.
    bad = put_request(user_id, cid, "c5")
    bad.parent_writes.add(task_id="t", idx=0, channel="ch")
    await expect_rpc_error(state_stub.PutCheckpoint(bad), INVALID, "parent_checkpoint_id")
    for lease, says in (
        (pb.CheckpointRunLease(ttl_ms=1000), "holder"),
        (pb.CheckpointRunLease(task_id=task), "ttl_ms"),
        (pb.CheckpointRunLease(holder="h", ttl_ms=1), "ttl_ms"),
        (pb.CheckpointRunLease(task_id="x", release=True), "task_id"),
    ):
        request = put_request(user_id, cid, "c5", parent="c4")
        request.run_lease.CopyFrom(lease)
        await expect_rpc_error(state_stub.PutCheckpoint(request), INVALID, says)
    many = put_request(user_id, cid, "c5", parent="c4")
    many.parent_writes.extend(
        pb.CheckpointWrite(task_id="t", idx=i, channel="c")
        for i in range(d.MAX_CHECKPOINT_WRITES + 1)
    )
    await expect_rpc_error(state_stub.PutCheckpoint(many), INVALID, "parent_writes")
    assert await ids(state_stub, user_id, cid) == ["c4", "c3", "c2", "c1"]
