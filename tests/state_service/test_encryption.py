"""Encryption at rest (issue 24 item 5): the key file, sealing and opening, and a state
service over an encrypted PostgreSQL store. Every refusal has its status and ErrorInfo
reason and changes nothing stored."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeAlias

import grpc
import psycopg
import pytest

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service import domain as d
from agentstate.state_service.crypto import FileKms, KmsConfigError, envelope
from agentstate.state_service.crypto.kms import new_kek
from agentstate.state_service.storage.postgres import PostgresStore
from tests.conftest import start_state_server
from tests.state_service.test_error_details import error_info
from tests.support.encryption import encrypted_store, write_key_file
from tests.support.helpers import expect_rpc_error, new_conversation

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"

SECRET = "the-apple-watch-order-88235"
STATE = json.dumps(
    {
        "session_id": "s",
        "context": [{"id": "m1", "role": "USER", "content": [{"type": "text", "text": SECRET}]}],
        "summary": SECRET,
        "cur_iter": 3,
    }
).encode()


# ------------------------------------------------------------------ key file


def test_a_key_file_that_cannot_be_used_is_refused_with_its_reason(tmp_path: Path) -> None:
    cases: list[tuple[str, str]] = [
        ("", "cannot read the key file"),
        ("not json", "is not JSON"),
        ('{"keys": []}', 'must be {"primary"'),
        ('{"primary": "k1", "keys": {"k1": "!!"}}', "is not base64"),
        ('{"primary": "k1", "keys": {"k1": "AAAA"}}', "is 3 bytes, a KEK is 32"),
        (json.dumps({"primary": "k2", "keys": {"k1": new_kek()}}), "primary 'k2' is not one"),
    ]
    for index, (text, message) in enumerate(cases):
        path = tmp_path / f"keys{index}.json"
        if text:
            path.write_text(text)
        with pytest.raises(KmsConfigError, match=message.replace("(", r"\(")):
            FileKms(path)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"primary": "k1", "keys": {"k1": new_kek()}}))
    with pytest.raises(KmsConfigError, match="cannot append to the erased-keys file"):
        FileKms(good, tmp_path / "no-such-dir" / "erased")


def test_sealing_binds_each_ciphertext_to_its_row() -> None:
    key_id, raw = envelope.new_data_key()
    key = envelope.data_key(key_id, raw)
    here = envelope.associated_data("u1", 7, "state", "agent_state")
    token = envelope.seal_text(key, SECRET, here)
    assert token.startswith("\x01") and SECRET not in token
    assert envelope.seal_text(key, SECRET, here) != token  # a fresh nonce every time
    assert envelope.open_token(key, token, here, user_id="u1") == SECRET.encode()
    for elsewhere in (
        envelope.associated_data("u2", 7, "state", "agent_state"),
        envelope.associated_data("u1", 8, "state", "agent_state"),
        envelope.associated_data("u1", 7, "item", "agent_state"),
        envelope.associated_data("u1", 7, "state", "other"),
    ):
        with pytest.raises(d.CiphertextRejected):
            envelope.open_token(key, token, elsewhere, user_id="u1")
    other = envelope.data_key(*envelope.new_data_key())
    with pytest.raises(d.DataKeyDestroyed):
        envelope.open_token(other, token, here, user_id="u1")
    with pytest.raises(d.DataKeyDestroyed):
        envelope.open_token(None, token, here, user_id="u1")


def test_the_data_key_cache_is_bounded_and_expires() -> None:
    cache = envelope.DataKeyCache(size=2, ttl=60)
    keys = [envelope.data_key(*envelope.new_data_key()) for _ in range(3)]
    for index, key in enumerate(keys):
        cache.put(f"u{index}", key)
    assert len(cache) == 2 and cache.get("u0") is None and cache.get("u2") is keys[2]
    expired = envelope.DataKeyCache(size=2, ttl=0)
    expired.put("u", keys[0])
    assert expired.get("u") is None


async def test_the_database_counts_a_token_as_its_plaintext(
    pg_store: PostgresStore, database_url: str
) -> None:
    key = envelope.data_key(*envelope.new_data_key())
    texts = ["", "x", "ab", "abc", "é" * 7, SECRET * 40]
    with psycopg.connect(database_url, autocommit=True) as conn:
        for text in texts:
            token = envelope.seal_text(key, text, b"")
            (n,) = (
                conn.execute("SELECT agentstate_plain_length(%s::text)", (token,)).fetchone() or ()
            )
            assert n == len(text.encode()), text
            composite = '{"a": ' + token + ', "b": 1, "context": '
            (n,) = (
                conn.execute("SELECT agentstate_plain_length(%s::text)", (composite,)).fetchone()
                or ()
            )
            assert n == len(composite.replace(token, text).encode())


# ------------------------------------------------------------------ a service on it


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    return write_key_file(tmp_path / "keys.json")


@pytest.fixture
async def sealed_store(database_url: str, key_file: Path) -> AsyncIterator[PostgresStore]:
    store = encrypted_store(database_url, key_file)
    await store.open()
    yield store
    await store.close()


async def _stub_for(store: PostgresStore) -> tuple[grpc.aio.Server, grpc.aio.Channel, Stub]:
    server, address = await start_state_server(store)
    channel = grpc.aio.insecure_channel(address)
    return server, channel, pb_grpc.StateServiceStub(channel)


@pytest.fixture
async def sealed_stub(sealed_store: PostgresStore) -> AsyncIterator[Stub]:
    server, channel, stub = await _stub_for(sealed_store)
    yield stub
    await channel.close(None)
    await server.stop(None)


def _rows_text(database_url: str, user_id: str) -> str:
    """Every payload column of the user's rows, as text."""
    with psycopg.connect(database_url) as conn:
        parts: list[str] = []
        for statement in (
            "SELECT context_head, context_tail, member_values::text, payload::text "
            "FROM t_agent_state WHERE user_id = %s",
            "SELECT message, messages::text FROM t_agent_state_message WHERE user_id = %s",
            "SELECT blocks::text, metadata::text FROM t_agent_message WHERE user_id = %s",
            "SELECT item_text FROM t_conversation_item WHERE user_id = %s",
            "SELECT member_values::text FROM t_scoped_state WHERE user_id = %s",
        ):
            for row in conn.execute(statement, (user_id,)).fetchall():
                parts += [str(v) for v in row if v is not None]
        return "\n".join(parts)


async def test_a_state_is_sealed_at_rest_and_reads_back_byte_for_byte(
    sealed_stub: Stub, database_url: str, user_id: str
) -> None:
    cid = await new_conversation(sealed_stub, user_id)
    saved = await sealed_stub.UpsertState(
        pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, payload=STATE)
    )
    got = await sealed_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid))
    assert got.payload == STATE and got.version == saved.version == 1
    stored = _rows_text(database_url, user_id)
    assert stored and SECRET not in stored and "\x01" in stored
    # A delta: sealed messages appended, sealed fields; the whole reads back as sent.
    message = json.dumps({"id": "m2", "text": SECRET + "-2"}).encode()
    await sealed_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id,
            conversation_id=cid,
            delta=pb.StateDelta(
                base_version=1, messages=[message], fields_json=b'{"summary": "new"}'
            ),
        )
    )
    got = await sealed_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid))
    expected = json.loads(STATE)
    assert json.loads(got.payload) == {
        "summary": "new",
        "context": [*expected["context"], json.loads(message)],
    }
    assert SECRET not in _rows_text(database_url, user_id)


async def test_a_ciphertext_moved_to_another_row_does_not_open(
    sealed_stub: Stub, database_url: str, user_id: str
) -> None:
    first = await new_conversation(sealed_stub, user_id)
    second = await new_conversation(sealed_stub, user_id)
    for cid in (first, second):
        await sealed_stub.UpsertState(
            pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, payload=STATE)
        )
    # A small state's messages are one chunk (migration 16): move the first's chunk.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE t_agent_state_message SET messages = ("
            "  SELECT messages FROM t_agent_state_message WHERE user_id = %(u)s"
            "  AND session_id = %(a)s ORDER BY position LIMIT 1)"
            " WHERE user_id = %(u)s AND session_id = %(b)s",
            {"u": user_id, "a": int(first), "b": int(second)},
        )
        before = conn.execute(
            "SELECT messages FROM t_agent_state_message WHERE session_id = %s", (int(second),)
        ).fetchall()
    error = await expect_rpc_error(
        sealed_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=second)),
        grpc.StatusCode.DATA_LOSS,
        "moved from another row",
    )
    reason, _ = error_info(error)
    assert reason == "CIPHERTEXT_REJECTED"
    # The first conversation still reads; the refusal changed nothing.
    got = await sealed_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=first))
    assert got.payload == STATE
    with psycopg.connect(database_url) as conn:
        after = conn.execute(
            "SELECT messages FROM t_agent_state_message WHERE session_id = %s", (int(second),)
        ).fetchall()
    assert after == before


async def test_rows_written_before_encryption_was_on_still_read(
    pg_store: PostgresStore, sealed_stub: Stub, database_url: str, user_id: str
) -> None:
    server, channel, plain = await _stub_for(pg_store)
    try:
        cid = await new_conversation(plain, user_id)
        await plain.UpsertState(
            pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, payload=STATE)
        )
    finally:
        await channel.close(None)
        await server.stop(None)
    got = await sealed_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid))
    assert got.payload == STATE
    # A delta with encryption on: the new message sealed beside the plaintext ones.
    message = b'{"id": "m2"}'
    await sealed_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id,
            conversation_id=cid,
            delta=pb.StateDelta(base_version=1, messages=[message]),
        )
    )
    got = await sealed_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid))
    # The plaintext parts kept as they were, the sealed one opened in its place.
    assert got.payload == STATE.replace(b"}]}]", b'}]}, {"id": "m2"}]')


async def test_sealed_rows_with_encryption_off_or_without_their_kek_are_refused(
    sealed_stub: Stub, pg_store: PostgresStore, database_url: str, tmp_path: Path, user_id: str
) -> None:
    cid = await new_conversation(sealed_stub, user_id)
    await sealed_stub.UpsertState(
        pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, payload=STATE)
    )
    before = _rows_text(database_url, user_id)
    server, channel, plain = await _stub_for(pg_store)
    try:
        error = await expect_rpc_error(
            plain.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)),
            grpc.StatusCode.FAILED_PRECONDITION,
            "STATE_ENCRYPTION is off",
        )
        reason, _ = error_info(error)
        assert reason == "ENCRYPTION_KEY_UNAVAILABLE"
    finally:
        await channel.close(None)
        await server.stop(None)
    # A key file without the KEK that wrapped the user's key.
    other = encrypted_store(
        database_url, write_key_file(tmp_path / "other.json", primary="k9", keys={"k9": new_kek()})
    )
    await other.open()
    server, channel, stub = await _stub_for(other)
    try:
        error = await expect_rpc_error(
            stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)),
            grpc.StatusCode.FAILED_PRECONDITION,
            "key-encryption key 'k1', which STATE_ENCRYPTION_KEY_FILE does not hold",
        )
        reason, _ = error_info(error)
        assert reason == "ENCRYPTION_KEY_UNAVAILABLE"
        # A write needs the user's data key too: refused before anything is written.
        error = await expect_rpc_error(
            stub.UpsertState(
                pb.UpsertStateRequest(
                    user_id=user_id, conversation_id=cid, payload=b'{"x": 1}', expected_version=1
                )
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "put that key back in the file",
        )
        reason, _ = error_info(error)
        assert reason == "ENCRYPTION_KEY_UNAVAILABLE"
    finally:
        await channel.close(None)
        await server.stop(None)
        await other.close()
    assert _rows_text(database_url, user_id) == before


async def test_records_are_sealed_and_read_back(
    sealed_stub: Stub, database_url: str, user_id: str
) -> None:
    blocks = json.dumps([{"type": "text", "text": SECRET}]).encode()
    begun = await sealed_stub.BeginTurn(
        pb.BeginTurnRequest(
            user_id=user_id,
            title="t",
            holder="h",
            ttl_ms=10_000,
            new_messages=[pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=blocks)],
        )
    )
    cid = begun.conversation.conversation_id
    await sealed_stub.AppendMessage(
        pb.AppendMessageRequest(
            user_id=user_id,
            conversation_id=cid,
            message=pb.NewMessage(
                role=pb.MESSAGE_ROLE_ASSISTANT,
                blocks_json=blocks,
                metadata_json=b'{"k": "%s"}' % SECRET.encode(),
            ),
        )
    )
    listed = await sealed_stub.ListMessages(
        pb.ListMessagesRequest(user_id=user_id, conversation_id=cid)
    )
    assert [json.loads(m.blocks_json) for m in listed.messages] == [json.loads(blocks)] * 2
    assert json.loads(listed.messages[1].metadata_json) == {"k": SECRET}
    assert SECRET not in _rows_text(database_url, user_id)
    # Blocks that are not JSON are refused as before, naming the write.
    await expect_rpc_error(
        sealed_stub.AppendMessage(
            pb.AppendMessageRequest(
                user_id=user_id,
                conversation_id=cid,
                message=pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=b"[nope"),
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "blocks_json",
    )


def _uuid() -> str:
    return str(uuid.uuid4())


async def test_items_events_scoped_state_and_checkpoints_are_sealed_at_rest(
    sealed_stub: Stub, database_url: str, user_id: str
) -> None:
    cid = await new_conversation(sealed_stub, user_id)
    item = json.dumps({"text": SECRET}).encode()
    await sealed_stub.AppendItems(
        pb.AppendItemsRequest(
            user_id=user_id, conversation_id=cid, items=[pb.NewItem(item_json=item)]
        )
    )
    app = f"app-{uuid.uuid4()}"
    delta = json.dumps({"k": SECRET}).encode()
    await sealed_stub.AppendEvent(
        pb.AppendEventRequest(
            user_id=user_id,
            conversation_id=cid,
            item=pb.NewItem(item_json=item),
            state_key="adk.session",
            state_delta_json=delta,
            app_name=app,
            app_state_delta_json=delta,
            user_state_delta_json=delta,
        )
    )
    value = SECRET.encode() * 3
    await sealed_stub.PutCheckpoint(
        pb.PutCheckpointRequest(
            user_id=user_id,
            conversation_id=cid,
            namespace="",
            checkpoint_id="c1",
            checkpoint_type="msgpack",
            checkpoint=value,
            metadata_json=json.dumps(
                {"source": "loop", "step": 1, "writes": {"n": SECRET}}
            ).encode(),
            channel_versions={"messages": "1"},
            new_channel_values=[
                pb.ChannelValue(channel="messages", version="1", value_type="msgpack", value=value)
            ],
        )
    )
    await sealed_stub.PutCheckpointWrites(
        pb.PutCheckpointWritesRequest(
            user_id=user_id,
            conversation_id=cid,
            namespace="",
            checkpoint_id="c1",
            writes=[
                pb.CheckpointWrite(
                    task_id="t", idx=0, channel="messages", value_type="msgpack", value=value
                )
            ],
        )
    )
    # A step's writes carried on the next put (one call per LangGraph step) are sealed too.
    await sealed_stub.PutCheckpoint(
        pb.PutCheckpointRequest(
            user_id=user_id,
            conversation_id=cid,
            namespace="",
            checkpoint_id="c2",
            parent_checkpoint_id="c1",
            checkpoint_type="msgpack",
            checkpoint=value,
            metadata_json=b'{"source": "loop", "step": 2}',
            channel_versions={"messages": "1"},
            parent_writes=[
                pb.CheckpointWrite(
                    task_id="t2", idx=0, channel="messages", value_type="msgpack", value=value
                )
            ],
        )
    )
    # Read back as sent.
    listed = await sealed_stub.ListItems(pb.ListItemsRequest(user_id=user_id, conversation_id=cid))
    assert [i.item_json for i in listed.items] == [item, item]
    state = await sealed_stub.GetState(
        pb.GetStateRequest(user_id=user_id, conversation_id=cid, state_key="adk.session")
    )
    assert state.payload == b'{"k": "%s"}' % SECRET.encode()
    scoped = await sealed_stub.GetScopedState(
        pb.GetScopedStateRequest(user_id=user_id, app_name=app)
    )
    assert scoped.app_state.payload == scoped.user_state.payload == state.payload
    got = await sealed_stub.GetCheckpoint(
        pb.GetCheckpointRequest(
            user_id=user_id, conversation_id=cid, namespace="", checkpoint_id="c1"
        )
    )
    checkpoint = got.checkpoint
    assert checkpoint.checkpoint == value and checkpoint.checkpoint_type == "msgpack"
    assert json.loads(checkpoint.metadata_json)["writes"] == {"n": SECRET}
    assert [(v.value_type, v.value) for v in checkpoint.channel_values] == [("msgpack", value)]
    assert sorted((w.task_id, w.value_type, w.value) for w in checkpoint.pending_writes) == [
        ("t", "msgpack", value),
        ("t2", "msgpack", value),
    ]
    # Still searchable by its top-level scalars.
    found = await sealed_stub.ListCheckpoints(
        pb.ListCheckpointsRequest(
            user_id=user_id, conversation_id=cid, metadata_filter_json=b'{"source": "loop"}'
        )
    )
    assert sorted(c.checkpoint_id for c in found.checkpoints) == ["c1", "c2"]
    # At rest: no plaintext in any payload column.
    assert SECRET not in _rows_text(database_url, user_id)
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT c.checkpoint, c.metadata::text, c.metadata_text, b.value, w.value "
            "FROM t_checkpoint c JOIN t_checkpoint_blob b USING (user_id, conversation_id) "
            "JOIN t_checkpoint_write w USING (user_id, conversation_id) WHERE user_id = %s",
            (user_id,),
        ).fetchall()
        app_row = conn.execute(
            "SELECT member_values::text FROM t_scoped_state WHERE app_name = %s AND user_id = ''",
            (app,),
        ).fetchone()
    assert rows and app_row
    for row in rows:
        for column in row:
            text = column if isinstance(column, str) else bytes(column).decode("latin-1")
            assert SECRET not in text
    assert SECRET not in str(app_row[0])
