"""Encryption at rest (issue 24 item 5): erasing a user destroys their data key, also for
a database restored from a backup taken before (crypto-shredding); key rotation runs
online under reads and writes; the settings refuse what cannot work."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import TypeAlias

import grpc
import psycopg
import pytest

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.crypto.kms import new_kek
from agentstate.state_service.storage.postgres import PostgresStore
from tests.conftest import create_database, start_state_server
from tests.state_service.test_error_details import error_info
from tests.support.encryption import encrypted_store, write_key_file
from tests.support.helpers import expect_rpc_error, new_conversation
from tests.support.state_process import StateServices, on_postgres, run_command

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"


def _state(user: str) -> bytes:
    return json.dumps({"context": [{"text": f"private words of {user}"}], "summary": user}).encode()


async def _open(store: PostgresStore) -> tuple[grpc.aio.Server, grpc.aio.Channel, Stub]:
    await store.open()
    server, address = await start_state_server(store)
    channel = grpc.aio.insecure_channel(address)
    return server, channel, pb_grpc.StateServiceStub(channel)


async def _close(server: grpc.aio.Server, channel: grpc.aio.Channel, store: PostgresStore) -> None:
    await channel.close(None)
    await server.stop(None)
    await store.close()


async def _fill(stub: Stub, user: str) -> str:
    cid = await new_conversation(stub, user)
    await stub.UpsertState(
        pb.UpsertStateRequest(user_id=user, conversation_id=cid, payload=_state(user))
    )
    await stub.AppendItems(
        pb.AppendItemsRequest(
            user_id=user, conversation_id=cid, items=[pb.NewItem(item_json=b'{"i": 1}')]
        )
    )
    return cid


async def test_an_erased_users_data_is_unreadable_in_a_restored_older_backup(
    postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    source = create_database(postgres, f"shred_src_{suffix}")
    key_file = write_key_file(tmp_path / "keys.json", {"k1": new_kek()})
    erased_file = tmp_path / "erased-keys"
    erased, kept = f"erased-{suffix}", f"kept-{suffix}"
    store = encrypted_store(source, key_file, erased_file)
    server, channel, stub = await _open(store)
    try:
        erased_cid = await _fill(stub, erased)
        kept_cid = await _fill(stub, kept)
        dump = tmp_path / "before-erase.sql"
        await asyncio.to_thread(
            subprocess.run,
            ["pg_dump", "--no-owner", "--no-privileges", "--format=plain", "-f", str(dump), source],
            check=True,
            capture_output=True,
        )
        assert f"private words of {erased}" not in dump.read_text()  # sealed in the dump
        await stub.EraseUser(pb.EraseUserRequest(user_id=erased))
    finally:
        await _close(server, channel, store)
    with psycopg.connect(source) as conn:
        (left,) = conn.execute(
            "SELECT count(*) FROM t_user_key WHERE user_id = %s", (erased,)
        ).fetchone() or (None,)
    assert left == 0
    assert erased_file.read_text().split() and len(erased_file.read_text().split()) == 1

    restored = create_database(postgres, f"shred_dst_{suffix}")
    await asyncio.to_thread(
        subprocess.run,
        ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(dump), restored],
        check=True,
        capture_output=True,
    )
    with psycopg.connect(restored) as conn:  # the backup still holds the wrapped key
        (held,) = conn.execute(
            "SELECT count(*) FROM t_user_key WHERE user_id = %s", (erased,)
        ).fetchone() or (None,)
    assert held == 1
    store = encrypted_store(restored, key_file, erased_file)  # the same KEK
    server, channel, stub = await _open(store)
    try:
        for call in (
            stub.GetState(pb.GetStateRequest(user_id=erased, conversation_id=erased_cid)),
            stub.ListItems(pb.ListItemsRequest(user_id=erased, conversation_id=erased_cid)),
        ):
            error = await expect_rpc_error(
                call, grpc.StatusCode.DATA_LOSS, "destroyed when the user was erased"
            )
            reason, _ = error_info(error)
            assert reason == "DATA_KEY_DESTROYED"
        got = await stub.GetState(pb.GetStateRequest(user_id=kept, conversation_id=kept_cid))
        assert got.payload == _state(kept)
        listed = await stub.ListItems(pb.ListItemsRequest(user_id=kept, conversation_id=kept_cid))
        assert [i.item_json for i in listed.items] == [b'{"i": 1}']
    finally:
        await _close(server, channel, store)
    with psycopg.connect(restored) as conn:  # the refusals changed nothing
        (held,) = conn.execute(
            "SELECT count(*) FROM t_user_key WHERE user_id = %s", (erased,)
        ).fetchone() or (None,)
    assert held == 1


async def test_a_user_erased_and_back_gets_a_new_key(database_url: str, tmp_path: Path) -> None:
    key_file = write_key_file(tmp_path / "keys.json")
    store = encrypted_store(database_url, key_file, tmp_path / "erased")
    server, channel, stub = await _open(store)
    user = f"back-{uuid.uuid4()}"
    try:
        await _fill(stub, user)
        with psycopg.connect(database_url) as conn:
            first = conn.execute("SELECT key_id FROM t_user_key WHERE user_id = %s", (user,))
            (old_key,) = first.fetchone() or (None,)
        await stub.EraseUser(pb.EraseUserRequest(user_id=user))
        cid = await _fill(stub, user)
        got = await stub.GetState(pb.GetStateRequest(user_id=user, conversation_id=cid))
        assert got.payload == _state(user)
        with psycopg.connect(database_url) as conn:
            again = conn.execute("SELECT key_id FROM t_user_key WHERE user_id = %s", (user,))
            (new_key,) = again.fetchone() or (None,)
        assert new_key is not None and new_key != old_key
    finally:
        await _close(server, channel, store)


def _kek_counts(database_url: str, users: list[str]) -> dict[str, int]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT kek_id, count(*) FROM t_user_key WHERE user_id = ANY(%s) GROUP BY kek_id",
            (users,),
        ).fetchall()
    return {str(k): int(n) for k, n in rows}


async def test_key_rotation_runs_online_under_reads_and_writes(
    postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    # A database of its own: rotate-keys rewraps every key of the database.
    database_url = create_database(postgres, f"rotation_{uuid.uuid4().hex[:8]}")
    old, new = new_kek(), new_kek()
    key_file = write_key_file(tmp_path / "keys.json", {"old": old}, primary="old")
    store = encrypted_store(database_url, key_file, ttl=0.2)  # keys unwrapped again often
    server, channel, stub = await _open(store)
    users = [f"rot-{i}-{uuid.uuid4().hex[:6]}" for i in range(12)]
    try:
        cids = {u: await _fill(stub, u) for u in users}
        assert _kek_counts(database_url, users) == {"old": 12}
        stop = asyncio.Event()
        done: dict[str, int] = dict.fromkeys(users, 1)
        failures: list[str] = []

        async def traffic(user: str) -> None:
            while not stop.is_set():
                try:
                    got = await stub.GetState(
                        pb.GetStateRequest(user_id=user, conversation_id=cids[user])
                    )
                    assert got.payload == _state(user)
                    saved = await stub.UpsertState(
                        pb.UpsertStateRequest(
                            user_id=user,
                            conversation_id=cids[user],
                            payload=_state(user),
                            expected_version=got.version,
                        )
                    )
                    done[user] = saved.version
                except (grpc.aio.AioRpcError, AssertionError) as exc:
                    failures.append(f"{user}: {exc}")
                    return

        tasks = [asyncio.create_task(traffic(u)) for u in users]
        await asyncio.sleep(0.3)
        # A new KEK becomes primary; the old one still unwraps.
        write_key_file(key_file, {"old": old, "new": new}, primary="new")
        newcomer = f"rot-new-{uuid.uuid4().hex[:6]}"
        await _fill(stub, newcomer)
        assert _kek_counts(database_url, [newcomer]) == {"new": 1}
        env = {
            "STATE_STORE": "postgres",
            "DATABASE_URL": database_url,
            "STATE_ENCRYPTION": "on",
            "STATE_ENCRYPTION_KEY_FILE": str(key_file),
        }
        rotated = await asyncio.to_thread(run_command, env, "rotate-keys", "--batch-size", "5")
        assert rotated.returncode == 0, rotated.stderr
        assert "with key-encryption key 'new'" in rotated.stdout
        assert "no data key is wrapped by another key" in rotated.stdout
        assert _kek_counts(database_url, [*users, newcomer]) == {"new": 13}
        # The old KEK retired: everything still reads, keys unwrapped by the new one.
        write_key_file(key_file, {"new": new}, primary="new")
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*tasks)
        assert failures == []
        assert all(version > 2 for version in done.values()), done
        for user in users:
            got = await stub.GetState(pb.GetStateRequest(user_id=user, conversation_id=cids[user]))
            assert (got.payload, got.version) == (_state(user), done[user])
    finally:
        await _close(server, channel, store)


def test_the_service_process_seals_with_its_settings(
    state_services: StateServices, database_url: str, tmp_path: Path
) -> None:
    key_file = write_key_file(tmp_path / "keys.json")
    address = state_services.serve(
        on_postgres(
            database_url,
            STATE_ENCRYPTION="on",
            STATE_ENCRYPTION_KEY_FILE=str(key_file),
            STATE_ENCRYPTION_ERASED_FILE=str(tmp_path / "erased"),
            STATE_ENCRYPTION_KEY_CACHE_SIZE="10",
            STATE_ENCRYPTION_KEY_CACHE_SECONDS="5",
        )
    )
    user = f"process-{uuid.uuid4()}"
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        cid = stub.CreateConversation(
            pb.CreateConversationRequest(user_id=user)
        ).conversation.conversation_id
        stub.UpsertState(
            pb.UpsertStateRequest(user_id=user, conversation_id=cid, payload=_state(user))
        )
        got = stub.GetState(pb.GetStateRequest(user_id=user, conversation_id=cid))
        assert got.payload == _state(user)
        with psycopg.connect(database_url) as conn:
            (head,) = conn.execute(
                "SELECT context_head FROM t_agent_state WHERE user_id = %s", (user,)
            ).fetchone() or (None,)
        assert str(head).startswith("\x01")  # sealed by the process
        stub.EraseUser(pb.EraseUserRequest(user_id=user))
    with psycopg.connect(database_url) as conn:
        (keys,) = conn.execute(
            "SELECT count(*) FROM t_user_key WHERE user_id = %s", (user,)
        ).fetchone() or (None,)
    assert keys == 0 and len((tmp_path / "erased").read_text().split()) == 1


def test_settings_that_cannot_work_stop_the_start(
    state_services: StateServices, tmp_path: Path
) -> None:
    base = {"STATE_STORE": "memory", "STATE_LISTEN_ADDRESS": "127.0.0.1:0"}
    cases = [
        ({"STATE_ENCRYPTION": "on"}, "STATE_ENCRYPTION=on needs STATE_ENCRYPTION_KEY_FILE"),
        (
            {"STATE_ENCRYPTION": "on", "STATE_ENCRYPTION_KEY_FILE": str(tmp_path / "none")},
            "needs a PostgreSQL store",
        ),
    ]
    for settings, message in cases:
        result = run_command({**base, **settings}, "serve", timeout=60)
        assert result.returncode == 2 and message in result.stderr, result.stderr
    rotate = run_command(base, "rotate-keys", timeout=60)
    assert rotate.returncode == 2 and "rotate-keys needs STATE_ENCRYPTION=on" in rotate.stderr


@pytest.mark.parametrize("content", ["", "{}"])
def test_a_missing_or_broken_key_file_stops_the_start(
    tmp_path: Path, database_url: str, content: str
) -> None:
    path = tmp_path / "keys.json"
    if content:
        path.write_text(content)
    result = run_command(
        {
            "STATE_STORE": "postgres",
            "DATABASE_URL": database_url,
            "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
            "STATE_ENCRYPTION": "on",
            "STATE_ENCRYPTION_KEY_FILE": str(path),
        },
        "serve",
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "STATE_ENCRYPTION_KEY_FILE:" in result.stderr
