"""ListConversations' filters, labels, status and time to live (issue 23), over both
stores and over gRPC, with every refusal."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import TypeAlias

import grpc
import pytest

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service import domain as d
from agentstate.state_service.domain import MessageRole, MessageStatus, NewMessage
from agentstate.state_service.servicer import StateServicer
from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.base.lifecycle import TtlChange
from agentstate.state_service.storage.postgres import PostgresStore
from tests.conftest import TEST_MAX_PAYLOAD_BYTES, create_database
from tests.state_service.test_error_details import error_info
from tests.support.helpers import expect_rpc_error

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"


async def test_labels_key_prefix_title_time_and_pages(store: StateStore, user_id: str) -> None:
    made = []
    for n in range(5):
        made.append(
            await store.create_conversation(
                user_id=user_id,
                title=f"order {n}" if n % 2 else f"chat {n}",
                external_key=f"adk:shop:{n}" if n < 3 else f"openai:{n}",
                labels={"team": "shop" if n < 4 else "ops", **({"beta": ""} if n == 1 else {})},
            )
        )
    assert made[1].labels == {"beta": "", "team": "shop"}

    async def ids(**filters: object) -> list[int]:
        where = d.ConversationFilter(user_id=user_id, **filters)  # type: ignore[arg-type]
        found = await store.search_conversations(where=where, page_size=50, before_id=None)
        return [c.conversation_id for c in found.page.items]

    cid = [c.conversation_id for c in made]
    assert await ids() == cid[::-1]
    assert await ids(key_prefix="adk:shop:") == [cid[2], cid[1], cid[0]]
    assert await ids(key_prefix="adk:sho_:") == []  # LIKE's wildcards are literal
    assert await ids(title_prefix="order") == [cid[3], cid[1]]
    sel = d.parse_label_selector
    assert await ids(selector=sel("team=shop")) == [cid[3], cid[2], cid[1], cid[0]]
    assert await ids(selector=sel("team!=shop")) == [cid[4]]
    assert await ids(selector=sel("beta")) == [cid[1]]
    assert await ids(selector=sel("!beta,team==shop")) == [cid[3], cid[2], cid[0]]
    assert await ids(selector=sel("team=shop"), key_prefix="openai:") == [cid[3]]
    after = made[2].update_time
    assert await ids(updated_after=after) == [cid[4], cid[3], cid[2]]
    assert await ids(updated_before=after) == [cid[1], cid[0]]

    # Pages: stable order, a total over every match, the token carries on.
    where = d.ConversationFilter(user_id=user_id, selector=sel("team=shop"))
    first = await store.search_conversations(
        where=where, page_size=3, before_id=None, include_total=True
    )
    assert first.total == 4 and len(first.page.items) == 3 and first.page.next_page_token
    second = await store.search_conversations(
        where=where, page_size=3, before_id=int(first.page.next_page_token), include_total=True
    )
    assert second.total == 4 and [c.conversation_id for c in second.page.items] == [cid[0]]
    assert second.page.next_page_token == ""

    # Later changes: set and remove labels.
    changed = await store.set_conversation_facts(
        user_id=user_id,
        conversation_id=cid[0],
        labels=d.LabelChange({"tier": "gold"}, ["team"]),
        ttl=TtlChange(),
    )
    assert changed.labels == {"tier": "gold"}
    assert await ids(selector=sel("tier=gold")) == [cid[0]]


async def test_status_is_kept_by_the_server(store: StateStore, user_id: str) -> None:
    async def conversation_with(status: MessageStatus | None) -> int:
        cid = (await store.create_conversation(user_id=user_id, title="t")).conversation_id
        if status is not None:
            await store.append_message(
                user_id=user_id,
                conversation_id=cid,
                message=NewMessage(MessageRole.ASSISTANT, b"[]", status),
            )
        return cid

    idle = await conversation_with(MessageStatus.NORMAL)
    awaiting = await conversation_with(MessageStatus.AWAITING_CONFIRM)
    failed = await conversation_with(MessageStatus.ERROR)
    running = await conversation_with(None)
    await store.acquire_lease(
        user_id=user_id, conversation_id=running, holder="h", ttl_ms=60_000, max_user_leases=0
    )
    got = await store.get_conversation(user_id=user_id, conversation_id=failed)
    assert got.status is d.ConversationStatus.FAILED and got.last_turn_time is not None
    fresh = await store.get_conversation(user_id=user_id, conversation_id=running)
    assert fresh.status is d.ConversationStatus.RUNNING and fresh.last_turn_time is None

    async def with_status(*statuses: d.ConversationStatus) -> list[int]:
        found = await store.search_conversations(
            where=d.ConversationFilter(user_id=user_id, statuses=frozenset(statuses)),
            page_size=10,
            before_id=None,
            include_total=True,
        )
        assert found.total == len(found.page.items)
        return [c.conversation_id for c in found.page.items]

    assert await with_status(d.ConversationStatus.IDLE) == [idle]
    assert await with_status(d.ConversationStatus.AWAITING_CONFIRMATION) == [awaiting]
    assert await with_status(d.ConversationStatus.FAILED) == [failed]
    assert await with_status(d.ConversationStatus.RUNNING) == [running]
    assert await with_status(d.ConversationStatus.RUNNING, d.ConversationStatus.FAILED) == [
        running,
        failed,
    ]


async def test_time_to_live_fixed_and_renewed_and_a_running_turn_is_spared(
    store: StateStore, user_id: str, other_user_id: str
) -> None:
    fixed = await store.create_conversation(
        user_id=user_id, title="t", ttl=d.TimeToLive(1, d.TtlPolicy.FIXED)
    )
    assert fixed.ttl == d.TimeToLive(1, d.TtlPolicy.FIXED) and fixed.expire_time is not None
    assert fixed.expire_time - fixed.create_time < timedelta(seconds=2)
    renewed = await store.create_conversation(
        user_id=user_id, title="t", ttl=d.TimeToLive(2, d.TtlPolicy.RENEW_ON_WRITE)
    )
    busy = (
        await store.resolve_conversation(
            user_id=user_id,
            external_key="busy",
            create_if_missing=True,
            title="t",
            ttl=d.TimeToLive(1),
        )
    ).conversation
    keep = await store.create_conversation(user_id=other_user_id, title="no ttl")
    lease = (
        await store.acquire_lease(
            user_id=user_id,
            conversation_id=busy.conversation_id,
            holder="h",
            ttl_ms=60_000,
            max_user_leases=0,
        )
    ).lease
    await asyncio.sleep(1.2)
    # A write renews the renewed one: its expiry moves with its last change.
    await store.append_message(
        user_id=user_id,
        conversation_id=renewed.conversation_id,
        message=NewMessage(MessageRole.USER, b"[]"),
    )
    now_renewed = await store.get_conversation(
        user_id=user_id, conversation_id=renewed.conversation_id
    )
    assert now_renewed.expire_time is not None and renewed.expire_time is not None
    assert now_renewed.expire_time > renewed.expire_time

    counts = await store.purge_expired()
    assert counts.conversations >= 1
    left = {
        c.conversation_id
        for c in (
            await store.list_conversations(user_id=user_id, page_size=10, before_id=None)
        ).items
    }
    assert left == {renewed.conversation_id, busy.conversation_id}  # the running one stays
    await store.get_conversation(user_id=other_user_id, conversation_id=keep.conversation_id)

    # Cleared later: it no longer expires.
    cleared = await store.set_conversation_facts(
        user_id=user_id,
        conversation_id=busy.conversation_id,
        labels=d.LabelChange(),
        ttl=TtlChange(clear=True),
    )
    assert cleared.ttl is None and cleared.expire_time is None
    await store.release_lease(user_id=user_id, task_id=lease.task_id)
    await store.purge_expired()
    await store.get_conversation(user_id=user_id, conversation_id=busy.conversation_id)


@pytest.fixture
async def operator_stub(store: StateStore) -> AsyncIterator[Stub]:
    """A StateService that allows listing across users (STATE_ALLOW_LIST_ALL_USERS=on)."""
    from agentstate.common.grpc_server import bind, create_server

    server = create_server(max_message_bytes=4 * TEST_MAX_PAYLOAD_BYTES)
    pb_grpc.add_StateServiceServicer_to_server(
        StateServicer(store, max_payload_bytes=TEST_MAX_PAYLOAD_BYTES, allow_list_all_users=True),
        server,
    )
    address = bind(server, "127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(address) as channel:
        yield pb_grpc.StateServiceStub(channel)
    await server.stop(None)


async def test_list_over_grpc_with_states_and_across_users(
    state_stub: Stub, operator_stub: Stub, store: StateStore, user_id: str, other_user_id: str
) -> None:
    tag = user_id[-12:]
    for who in (user_id, other_user_id):
        created = await state_stub.CreateConversation(
            pb.CreateConversationRequest(
                user_id=who,
                title="t",
                external_key=f"adk:{tag}:s",
                labels={"run": tag},
                ttl=pb.TimeToLive(seconds=3600, policy=pb.TTL_POLICY_RENEW_ON_WRITE),
            )
        )
        assert created.conversation.labels == {"run": tag}
        assert created.conversation.ttl.policy == pb.TTL_POLICY_RENEW_ON_WRITE
        assert created.conversation.HasField("expire_time")
        assert created.conversation.status == pb.CONVERSATION_STATUS_IDLE
        await state_stub.UpsertState(
            pb.UpsertStateRequest(
                user_id=who,
                conversation_id=created.conversation.conversation_id,
                state_key="adk.session",
                payload=b'{"k": "' + who.encode() + b'"}',
            )
        )
    mine = await state_stub.ListConversations(
        pb.ListConversationsRequest(
            user_id=user_id,
            key_prefix=f"adk:{tag}:",
            include_state_key="adk.session",
            include_total=True,
        )
    )
    assert mine.total_count == 1 and len(mine.conversations) == 1
    (state,) = mine.states_json.values()
    assert state == b'{"k": "' + user_id.encode() + b'"}'

    error = await expect_rpc_error(
        state_stub.ListConversations(pb.ListConversationsRequest(all_users=True)),
        grpc.StatusCode.PERMISSION_DENIED,
        "STATE_ALLOW_LIST_ALL_USERS",
    )
    assert error_info(error) == ("PERMISSION_DENIED", {})
    everyone = await operator_stub.ListConversations(
        pb.ListConversationsRequest(
            all_users=True, label_selector=f"run={tag}", include_total=True, page_size=1
        )
    )
    assert everyone.total_count == 2 and everyone.next_page_token
    rest = await operator_stub.ListConversations(
        pb.ListConversationsRequest(
            all_users=True, label_selector=f"run={tag}", page_token=everyone.next_page_token
        )
    )
    owners = {everyone.conversations[0].user_id, rest.conversations[0].user_id}
    assert owners == {user_id, other_user_id}

    updated = await state_stub.UpdateConversation(
        pb.UpdateConversationRequest(
            user_id=user_id,
            conversation_id=mine.conversations[0].conversation_id,
            set_labels={"tier": "gold"},
            remove_labels=["run"],
            clear_ttl=True,
        )
    )
    assert dict(updated.conversation.labels) == {"tier": "gold"}
    assert not updated.conversation.HasField("ttl")
    assert not updated.conversation.HasField("expire_time")


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (pb.ListConversationsRequest(label_selector="a=b,,c"), "empty clause"),
        (pb.ListConversationsRequest(label_selector="-bad=1"), "does not parse"),
        (pb.ListConversationsRequest(label_selector="a=" + "v" * 64), "too long"),
        (
            pb.ListConversationsRequest(statuses=[pb.ConversationStatus.ValueType(9)]),
            "not a ConversationStatus",
        ),
        (pb.ListConversationsRequest(page_token="x"), "page_token"),
        (pb.ListConversationsRequest(include_state_key="bad key!"), "state_key"),
    ],
)
async def test_list_refusals(
    state_stub: Stub, user_id: str, request_: pb.ListConversationsRequest, message: str
) -> None:
    request_.user_id = user_id
    await expect_rpc_error(
        state_stub.ListConversations(request_), grpc.StatusCode.INVALID_ARGUMENT, message
    )


async def test_label_and_ttl_refusals_change_nothing(state_stub: Stub, user_id: str) -> None:
    bad = [
        ({"x" * 64: "v"}, "too long"),
        ({"ok": "v" * 64}, "too long"),
        ({"ok": "bad value"}, "malformed"),
        ({"Bad.Prefix/ok": "v"}, "prefix"),
        ({f"k{n}": "v" for n in range(65)}, "at most 64"),
    ]
    for labels, message in bad:
        await expect_rpc_error(
            state_stub.CreateConversation(
                pb.CreateConversationRequest(user_id=user_id, labels=labels)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            message,
        )
    await expect_rpc_error(
        state_stub.CreateConversation(
            pb.CreateConversationRequest(user_id=user_id, ttl=pb.TimeToLive(seconds=0))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ttl.seconds",
    )
    listed = await state_stub.ListConversations(pb.ListConversationsRequest(user_id=user_id))
    assert list(listed.conversations) == []  # nothing was created

    cid = (
        await state_stub.CreateConversation(
            pb.CreateConversationRequest(user_id=user_id, labels={f"k{n}": "" for n in range(64)})
        )
    ).conversation.conversation_id
    await expect_rpc_error(
        state_stub.UpdateConversation(
            pb.UpdateConversationRequest(user_id=user_id, conversation_id=cid, set_labels={"x": ""})
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "at most 64",
    )
    await expect_rpc_error(
        state_stub.UpdateConversation(
            pb.UpdateConversationRequest(
                user_id=user_id, conversation_id=cid, ttl=pb.TimeToLive(seconds=5), clear_ttl=True
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "not both",
    )
    await expect_rpc_error(
        state_stub.UpdateConversation(
            pb.UpdateConversationRequest(user_id=user_id, conversation_id="12345")
        ),
        grpc.StatusCode.NOT_FOUND,
    )
    got = await state_stub.GetConversation(
        pb.GetConversationRequest(user_id=user_id, conversation_id=cid)
    )
    assert len(got.conversation.labels) == 64 and "x" not in got.conversation.labels


async def test_postgres_page_uses_the_index(
    pg_store: PostgresStore, database_url: str, user_id: str
) -> None:
    """A page is O(page): the plan walks the (user_id, id) index backwards and stops at
    the limit; status and state are worked out for the page's rows only."""
    import psycopg

    from agentstate.state_service.storage.postgres import lifecycle_sql as lsql

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO t_conversation (user_id, title, labels) "
            "SELECT %s, 't', '{\"team\": \"shop\"}' FROM generate_series(1, 3000)",
            (user_id,),
        )
        await conn.execute("ANALYZE t_conversation")
    statement = lsql.search_statement(["user"], statuses=False, state=True)
    rows = await pg_store._rows(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + statement,
        {"user_id": user_id, "limit": 51, "state_key": "agent_state"},
    )
    plan = [str(next(iter(r.values()))) for r in rows]
    scans = [line for line in plan if "on t_conversation " in line]
    assert scans and all("Index" in line for line in scans), "\n".join(plan)
    read = [int(n) for line in scans for n in re.findall(r"actual rows=(\d+)", line)]
    assert read and max(read) <= 51, "\n".join(plan)  # 3000 rows, one page read

    # A label's page walks the label's index rows (kept by a trigger) the same way.
    statement = lsql.search_statement(
        ["user", "label_equal"], statuses=False, state=False, by_label=True
    )
    rows = await pg_store._rows(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + statement,
        {
            "user_id": user_id,
            "limit": 51,
            "label_equal": '{"team": "shop"}',
            "drive_key": "team",
            "drive_value": "shop",
        },
    )
    plan = [str(next(iter(r.values()))) for r in rows]
    scans = [line for line in plan if "on t_conversation_label " in line]
    assert scans and all("Index" in line for line in scans), "\n".join(plan)
    read = [int(n) for line in scans for n in re.findall(r"actual rows=(\d+)", line)]
    assert read and max(read) <= 51, "\n".join(plan)
    found = await pg_store.search_conversations(
        where=d.ConversationFilter(user_id=user_id, selector=d.parse_label_selector("team=shop")),
        page_size=50,
        before_id=None,
        include_total=True,
    )
    assert found.total == 3000 and len(found.page.items) == 50


async def test_the_sweeper_applies_time_to_live_without_global_retention(
    user_id: str,
) -> None:
    """STATE_RETENTION_DAYS=0 (keep forever) and a conversation with its own time to live:
    the service's sweeper still deletes it once it expires, and keeps the one without."""
    from agentstate.state_service.config import StateServiceSettings
    from agentstate.state_service.server import StateServiceApp

    app = StateServiceApp(
        StateServiceSettings(
            listen_address="127.0.0.1:0", store="memory", retention_interval_seconds=0.2
        )
    )
    await app.start()
    assert app.store is not None
    try:
        short = await app.store.create_conversation(user_id=user_id, title="t", ttl=d.TimeToLive(1))
        kept = await app.store.create_conversation(user_id=user_id, title="t")
        for _ in range(60):
            page = await app.store.list_conversations(user_id=user_id, page_size=10, before_id=None)
            ids = [c.conversation_id for c in page.items]
            if short.conversation_id not in ids:
                break
            await asyncio.sleep(0.1)
        assert ids == [kept.conversation_id]
    finally:
        await app.stop()


async def test_the_total_is_counted_up_to_a_bound(
    store: StateStore, user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """include_total counts at most MAX_COUNTED_TOTAL matches; past it the total is
    MAX_COUNTED_TOTAL + 1 ("more"), the same in both stores."""
    monkeypatch.setattr(d, "MAX_COUNTED_TOTAL", 3)
    for n in range(5):
        await store.create_conversation(user_id=user_id, title=f"t{n}", labels={"odd": str(n % 2)})

    async def total(selector: str) -> int | None:
        where = d.ConversationFilter(user_id=user_id, selector=d.parse_label_selector(selector))
        found = await store.search_conversations(
            where=where, page_size=1, before_id=None, include_total=True
        )
        return found.total

    assert await total("") == 4  # five: more than three
    assert await total("odd=0") == 3  # exactly three (n = 0, 2, 4)
    assert await total("odd=1") == 2


async def test_postgres_failed_page_walks_the_failed_conversations_only(
    pg_store: PostgresStore, database_url: str, user_id: str
) -> None:
    """A FAILED page (and its bounded count) reads the conversations with an ERROR record
    (t_agent_message_error_idx), not the user's 3,000 others; one whose later record
    succeeded is read and turned down."""
    import psycopg

    from agentstate.state_service.storage.postgres import lifecycle_sql as lsql

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO t_conversation (user_id, title) "
            "SELECT %s, 't' FROM generate_series(1, 3000)",
            (user_id,),
        )
        await conn.execute("ANALYZE t_conversation")
    failed, recovered = [], []
    for n in range(10):
        cid = (await pg_store.create_conversation(user_id=user_id, title="f")).conversation_id
        await pg_store.append_message(
            user_id=user_id,
            conversation_id=cid,
            message=NewMessage(MessageRole.ASSISTANT, b"[]", MessageStatus.ERROR),
        )
        if n % 3 == 0:  # went on after the failure: no longer FAILED
            await pg_store.append_message(
                user_id=user_id,
                conversation_id=cid,
                message=NewMessage(MessageRole.ASSISTANT, b"[]", MessageStatus.NORMAL),
            )
            recovered.append(cid)
        else:
            failed.append(cid)
        await pg_store.create_conversation(user_id=user_id, title="after")  # never failed
    where = d.ConversationFilter(user_id=user_id, statuses=frozenset({d.ConversationStatus.FAILED}))
    first = await pg_store.search_conversations(
        where=where, page_size=4, before_id=None, include_total=True
    )
    assert [c.conversation_id for c in first.page.items] == sorted(failed, reverse=True)[:4]
    assert first.total == len(failed)
    rest = await pg_store.search_conversations(
        where=where, page_size=4, before_id=int(first.page.next_page_token)
    )
    assert [c.conversation_id for c in rest.page.items] == sorted(failed, reverse=True)[4:]
    assert rest.page.next_page_token == ""

    params = {"user_id": user_id, "statuses": ["FAILED"], "limit": 5, "count_limit": 10_001}
    for statement in (
        lsql.page_statement([], statuses=True, by_failure=True),
        lsql.count_statement(["user"], statuses=True, by_failure=True),
    ):
        rows = await pg_store._rows("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + statement, params)
        plan = [str(next(iter(r.values()))) for r in rows]
        assert any("t_agent_message_error_idx" in line for line in plan), "\n".join(plan)
        scans = [line for line in plan if "on t_conversation " in line]
        assert scans and all("Index" in line for line in scans), "\n".join(plan)
        read = [int(n) for line in scans for n in re.findall(r"actual rows=(\d+)", line)]
        # One index probe per conversation with an ERROR record, at most: not 3,020.
        loops = [int(n) for line in scans for n in re.findall(r"loops=(\d+)", line)]
        assert max(read) <= 1 and max(loops) <= len(failed) + len(recovered), "\n".join(plan)


async def test_postgres_deep_page_keeps_its_plan_when_prepared(
    postgres: EmbeddedPostgres, limit_in_text: bool = True
) -> None:
    """The service's statements are prepared, and after five runs PostgreSQL may keep a
    generic plan, which cannot see a LIMIT parameter: it planned a deep page as every row
    after the token, sorted (36 ms at 100,000 conversations). With the page's limit in the
    text the generic plan still walks the key and stops at the page. A database of its
    own: the generic plan's estimate depends on how many users share the table."""
    import psycopg

    from agentstate.state_service.storage.postgres import lifecycle_sql as lsql
    from agentstate.state_service.storage.postgres.migrations import apply_migrations

    def generic(statement: str) -> str:
        names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
        for n, name in enumerate(names, 1):
            statement = statement.replace(f"%({name})s", f"${n}")
        return statement

    dsn = create_database(postgres, f"deep_page_{uuid.uuid4().hex[:8]}")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        async with conn.transaction():
            await apply_migrations(conn)
        # As the benchmark had them: three users of 1,000, 10,000 and 100,000.
        for user, n in (("small", 1000), ("medium", 10_000), ("big", 100_000)):
            await conn.execute(
                "INSERT INTO t_conversation (user_id, title) SELECT %s, 't' "
                "FROM generate_series(1, %s)",
                (user, n),
            )
        await conn.execute("ANALYZE t_conversation")
        cur = await conn.execute(
            "SELECT id FROM t_conversation WHERE user_id = 'big' ORDER BY id DESC OFFSET 90000 "
            "LIMIT 1"
        )
        row = await cur.fetchone()
        assert row is not None
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        if limit_in_text:
            statement = lsql.search_statement(
                ["user", "before"], statuses=False, state=False, limit=51
            )
        else:  # as it was: the limit a parameter
            statement = lsql.search_statement(["user", "before"], statuses=False, state=False)
        statement = generic(statement)
        types = "text, bigint" + ("" if limit_in_text else ", int")
        await conn.execute(f"PREPARE deep({types}) AS {statement}".encode())
        arguments = f"'big', {row[0]}" + ("" if limit_in_text else ", 51")
        cur = await conn.execute(
            f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE deep({arguments})".encode()
        )
        plan = [str(r[0]) for r in await cur.fetchall()]
    scans = [line for line in plan if "on t_conversation " in line]
    assert scans and all("Index" in line for line in scans), "\n".join(plan)
    read = [int(n) for line in scans for n in re.findall(r"actual rows=(\d+)", line)]
    assert max(read) <= 51 and not any("Sort" in line for line in plan), "\n".join(plan)


async def test_a_limit_parameter_loses_the_deep_page_plan(postgres: EmbeddedPostgres) -> None:
    """The check above can fail: with the limit a parameter, it does."""
    with pytest.raises(AssertionError):
        await test_postgres_deep_page_keeps_its_plan_when_prepared(postgres, limit_in_text=False)


async def test_a_failed_page_is_not_compiled_with_jit(postgres: EmbeddedPostgres) -> None:
    """A FAILED page over 10,000 failed conversations is planned as the page it reads, not
    as a walk of all 10,000: the status test told as likely (lifecycle_sql._status_match)
    keeps its estimated cost under jit_above_cost, where PostgreSQL would first compile it
    (25 ms of a 0.7 ms page, measured at 1,000,000 conversations)."""
    import json as jsonlib

    import psycopg

    from agentstate.state_service.storage.postgres import lifecycle_sql as lsql
    from agentstate.state_service.storage.postgres.migrations import apply_migrations

    dsn = create_database(postgres, f"jit_{uuid.uuid4().hex[:8]}")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        async with conn.transaction():
            await apply_migrations(conn)
        await conn.execute(
            "INSERT INTO t_conversation (user_id, title) SELECT 'u', 't' "
            "FROM generate_series(1, 10000)"
        )
        await conn.execute(
            "INSERT INTO t_agent_message (user_id, conversation_id, role, blocks, status) "
            "SELECT user_id, id, 'ASSISTANT', '[]', 'ERROR' FROM t_conversation"
        )
        await conn.execute("ANALYZE")
        cur = await conn.execute("SELECT current_setting('jit_above_cost')::float")
        row = await cur.fetchone()
        assert row is not None
        jit_above_cost = float(row[0])
        params = {"user_id": "u", "statuses": ["FAILED"]}

        async def cost(statement: str) -> float:
            cur = await conn.execute(("EXPLAIN (FORMAT JSON) " + statement).encode(), params)
            found = await cur.fetchone()
            assert found is not None
            plan = found[0] if isinstance(found[0], list) else jsonlib.loads(found[0])
            return float(plan[0]["Plan"]["Total Cost"])

        page = lsql.search_statement(
            ["user"], statuses=True, state=False, by_failure=True, limit=51
        )
        assert await cost(page) < jit_above_cost
        # The check can fail: the plain status test costs the whole walk.
        plain = page.replace(lsql._status_match(likely=True), lsql._status_match())
        assert plain != page and await cost(plain) > jit_above_cost
