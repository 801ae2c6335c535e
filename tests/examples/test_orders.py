"""The order demo's order system (examples/order_demo): one suite over both implementations."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.examples.order_demo.orders import (
    CouponStatus,
    MemoryOrderSystem,
    OrderStatus,
    OrderSystem,
    PostgresOrderSystem,
)
from agentstate.examples.order_demo.orders.seed import INITIAL_STOCK, SHANGHAI
from tests.conftest import create_database

WATCH = "WATCH-S12-42-AL-GPS-SG"
BAND = "SPORT-BAND-42"
CABLE = "USB-C-CABLE-1M"
AIRPODS = "AIRPODS-4"
COUPON = "CPN-88235"
NEWEST_FIRST = ["88240", "88239", "88237", "88235", "88230"]


@pytest.fixture(scope="session")
def orders_database_url(postgres: EmbeddedPostgres) -> str:
    # Its own database: the suite must not depend on (or disturb) the state service's.
    return create_database(postgres, "orders_test")


@pytest.fixture(params=["memory", "postgres"])
async def orders(request: pytest.FixtureRequest) -> AsyncIterator[OrderSystem]:
    system: OrderSystem
    if request.param == "memory":
        system = MemoryOrderSystem()
    else:
        # Looked up lazily so memory-only runs do not start PostgreSQL.
        url: str = request.getfixturevalue("orders_database_url")
        system = PostgresOrderSystem(url, min_size=1, max_size=12)
    await system.open()
    yield system
    await system.close()


@pytest.fixture
def user() -> str:
    return f"user-{uuid.uuid4()}"


@pytest.fixture
async def seeded(orders: OrderSystem, user: str) -> str:
    await orders.ensure_seeded(user)
    return user


def key() -> str:
    return f"call-{uuid.uuid4()}"


# --------------------------------------------------------------------- seeding


async def test_seeding_gives_five_orders_newest_first(orders: OrderSystem, seeded: str) -> None:
    recent = await orders.recent_orders(seeded, 20)
    assert [o.order_no for o in recent] == NEWEST_FIRST
    assert [o.status for o in recent] == [
        OrderStatus.PAID_AWAITING_SHIPMENT,
        OrderStatus.COMPLETED,
        OrderStatus.SHIPPED,
        OrderStatus.PAID_AWAITING_SHIPMENT,
        OrderStatus.COMPLETED,
    ]
    assert [o.paid_amount for o in recent] == [
        Decimal("129.00"),
        Decimal("59.00"),
        Decimal("899.00"),
        Decimal("3378.00"),
        Decimal("45.00"),
    ]
    assert all(o.user_id == seeded for o in recent)
    newest = recent[0]
    assert newest.placed_at == datetime(2026, 9, 20, 9, 12, tzinfo=SHANGHAI)
    assert newest.placed_at.utcoffset() == timedelta(hours=8)
    assert [(i.sku, i.name, i.quantity) for i in newest.items] == [(CABLE, "USB-C 充电线", 2)]

    watch_order = recent[3]
    assert watch_order.coupon_id == COUPON
    assert [(i.name, i.quantity) for i in watch_order.items] == [
        ("Apple Watch Series 12 深空灰色 42 毫米 铝金属 GPS", 1),
        ("运动表带", 1),
    ]
    # Item prices add up to what was paid plus the coupon's 100.00.
    gross = sum((i.unit_price * i.quantity for i in watch_order.items), Decimal(0))
    assert gross == watch_order.paid_amount + Decimal("100.00")
    for order in recent:
        if order.coupon_id is None:
            assert sum((i.unit_price * i.quantity for i in order.items), Decimal(0)) == (
                order.paid_amount
            )
    assert await orders.coupon_status(seeded, COUPON) == CouponStatus.USED


async def test_limit_takes_the_newest(orders: OrderSystem, seeded: str) -> None:
    assert [o.order_no for o in await orders.recent_orders(seeded, 2)] == NEWEST_FIRST[:2]
    assert [o.order_no for o in await orders.recent_orders(seeded, 1)] == NEWEST_FIRST[:1]


@pytest.mark.parametrize("limit", [0, -1, 21, 100])
async def test_limit_out_of_range_is_rejected(orders: OrderSystem, seeded: str, limit: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        await orders.recent_orders(seeded, limit)


async def test_unseeded_user_has_no_orders(orders: OrderSystem, user: str) -> None:
    assert await orders.recent_orders(user, 20) == []
    assert await orders.get_order(user, "88240") is None


async def test_seeding_is_idempotent_and_safe_concurrently(orders: OrderSystem, user: str) -> None:
    await asyncio.gather(*(orders.ensure_seeded(user) for _ in range(8)))
    await orders.ensure_seeded(user)
    assert [o.order_no for o in await orders.recent_orders(user, 20)] == NEWEST_FIRST


async def test_seeding_again_does_not_undo_a_cancel(orders: OrderSystem, seeded: str) -> None:
    assert (await orders.cancel_order(seeded, "88240", key())).cancelled
    await orders.ensure_seeded(seeded)
    order = await orders.get_order(seeded, "88240")
    assert order is not None and order.status is OrderStatus.CANCELLED


async def test_get_order_is_scoped_by_user(orders: OrderSystem, seeded: str) -> None:
    order = await orders.get_order(seeded, "88237")
    assert order is not None
    assert order.status is OrderStatus.SHIPPED
    assert [i.sku for i in order.items] == [AIRPODS]
    assert await orders.get_order(seeded, "99999") is None
    assert await orders.get_order(f"other-{uuid.uuid4()}", "88237") is None


def test_status_labels() -> None:
    assert [s.label for s in OrderStatus] == ["已支付待发货", "已发货", "已完成", "已取消"]


# ---------------------------------------------------------------------- cancel


async def test_cancel_restores_stock_returns_coupon_and_refunds(
    orders: OrderSystem, seeded: str
) -> None:
    watch, band = await orders.stock(WATCH), await orders.stock(BAND)
    assert watch >= 0 and band >= 0

    outcome = await orders.cancel_order(seeded, "88235", key())

    assert outcome.cancelled
    assert outcome.order_no == "88235"
    assert not outcome.replayed
    assert outcome.refund_amount == Decimal("3378.00")
    assert outcome.restored_stock == {WATCH: 1, BAND: 1}
    assert outcome.coupon_returned == COUPON
    assert "3378.00" in outcome.reason
    order = await orders.get_order(seeded, "88235")
    assert order is not None and order.status is OrderStatus.CANCELLED
    assert await orders.stock(WATCH) == watch + 1
    assert await orders.stock(BAND) == band + 1
    assert await orders.coupon_status(seeded, COUPON) == CouponStatus.AVAILABLE
    assert await orders.refunds(seeded, "88235") == [Decimal("3378.00")]


async def test_cancel_without_coupon(orders: OrderSystem, seeded: str) -> None:
    cable = await orders.stock(CABLE)
    outcome = await orders.cancel_order(seeded, "88240", key())
    assert outcome.cancelled
    assert outcome.coupon_returned is None
    assert outcome.restored_stock == {CABLE: 2}
    assert await orders.stock(CABLE) == cable + 2
    assert await orders.refunds(seeded, "88240") == [Decimal("129.00")]


@pytest.mark.parametrize(
    ("order_no", "status"), [("88237", OrderStatus.SHIPPED), ("88239", OrderStatus.COMPLETED)]
)
async def test_cancel_refused_unless_awaiting_shipment(
    orders: OrderSystem, seeded: str, order_no: str, status: OrderStatus
) -> None:
    before = await orders.get_order(seeded, order_no)
    assert before is not None
    stock_before = {i.sku: await orders.stock(i.sku) for i in before.items}

    outcome = await orders.cancel_order(seeded, order_no, key())

    assert not outcome.cancelled
    assert status.label in outcome.reason
    assert outcome.refund_amount is None
    assert outcome.restored_stock == {}
    assert outcome.coupon_returned is None
    assert await orders.get_order(seeded, order_no) == before
    assert {sku: await orders.stock(sku) for sku in stock_before} == stock_before
    assert await orders.refunds(seeded, order_no) == []


async def test_cancel_unknown_order(orders: OrderSystem, seeded: str) -> None:
    outcome = await orders.cancel_order(seeded, "99999", key())
    assert not outcome.cancelled
    assert "99999" in outcome.reason
    assert outcome.refund_amount is None


async def test_cancel_of_another_users_order_is_unknown(orders: OrderSystem, seeded: str) -> None:
    stranger = f"other-{uuid.uuid4()}"
    outcome = await orders.cancel_order(stranger, "88235", key())
    assert not outcome.cancelled
    order = await orders.get_order(seeded, "88235")
    assert order is not None and order.status is OrderStatus.PAID_AWAITING_SHIPMENT


async def test_cancel_twice_with_new_key_names_cancelled_status(
    orders: OrderSystem, seeded: str
) -> None:
    assert (await orders.cancel_order(seeded, "88240", key())).cancelled
    again = await orders.cancel_order(seeded, "88240", key())
    assert not again.cancelled
    assert not again.replayed
    assert OrderStatus.CANCELLED.label in again.reason
    assert await orders.refunds(seeded, "88240") == [Decimal("129.00")]


async def test_empty_idempotency_key_is_rejected(orders: OrderSystem, seeded: str) -> None:
    with pytest.raises(ValueError, match="idempotency_key"):
        await orders.cancel_order(seeded, "88240", "")


# ---------------------------------------------------------------- idempotency


async def test_same_key_replays_the_first_outcome(orders: OrderSystem, seeded: str) -> None:
    call = key()
    watch, band = await orders.stock(WATCH), await orders.stock(BAND)
    first = await orders.cancel_order(seeded, "88235", call)
    second = await orders.cancel_order(seeded, "88235", call)

    assert first.cancelled and not first.replayed
    assert second.replayed
    assert second.cancelled
    assert second.reason == first.reason
    assert second.refund_amount == first.refund_amount == Decimal("3378.00")
    assert second.restored_stock == first.restored_stock
    assert second.coupon_returned == first.coupon_returned
    # Applied once only.
    assert await orders.stock(WATCH) == watch + 1
    assert await orders.stock(BAND) == band + 1
    assert await orders.refunds(seeded, "88235") == [Decimal("3378.00")]


async def test_same_key_replays_a_refusal(orders: OrderSystem, seeded: str) -> None:
    call = key()
    first = await orders.cancel_order(seeded, "88237", call)
    second = await orders.cancel_order(seeded, "88237", call)
    assert not first.cancelled and not second.cancelled
    assert second.replayed and second.reason == first.reason


async def test_key_reused_for_another_order_is_rejected(orders: OrderSystem, seeded: str) -> None:
    call = key()
    await orders.cancel_order(seeded, "88240", call)
    with pytest.raises(ValueError, match="already used"):
        await orders.cancel_order(seeded, "88235", call)
    order = await orders.get_order(seeded, "88235")
    assert order is not None and order.status is OrderStatus.PAID_AWAITING_SHIPMENT


async def test_keys_are_scoped_by_user(orders: OrderSystem, seeded: str) -> None:
    other = f"other-{uuid.uuid4()}"
    await orders.ensure_seeded(other)
    call = key()
    assert (await orders.cancel_order(seeded, "88240", call)).cancelled
    theirs = await orders.cancel_order(other, "88240", call)
    assert theirs.cancelled and not theirs.replayed


# ---------------------------------------------------------------- concurrency


async def test_concurrent_cancels_with_different_keys_succeed_once(
    orders: OrderSystem, seeded: str
) -> None:
    watch, band = await orders.stock(WATCH), await orders.stock(BAND)
    outcomes = await asyncio.gather(
        *(orders.cancel_order(seeded, "88235", key()) for _ in range(10))
    )
    assert sum(o.cancelled for o in outcomes) == 1
    assert not any(o.replayed for o in outcomes)
    for refused in (o for o in outcomes if not o.cancelled):
        assert OrderStatus.CANCELLED.label in refused.reason
    assert await orders.stock(WATCH) == watch + 1
    assert await orders.stock(BAND) == band + 1
    assert await orders.refunds(seeded, "88235") == [Decimal("3378.00")]
    assert await orders.coupon_status(seeded, COUPON) == CouponStatus.AVAILABLE


async def test_concurrent_cancels_with_the_same_key_apply_once(
    orders: OrderSystem, seeded: str
) -> None:
    call = key()
    outcomes = await asyncio.gather(
        *(orders.cancel_order(seeded, "88240", call) for _ in range(10))
    )
    assert all(o.cancelled for o in outcomes)
    assert sum(not o.replayed for o in outcomes) == 1
    assert await orders.refunds(seeded, "88240") == [Decimal("129.00")]


async def test_concurrent_cancels_across_users_keep_stock_exact(orders: OrderSystem) -> None:
    users = [f"user-{uuid.uuid4()}" for _ in range(5)]
    await asyncio.gather(*(orders.ensure_seeded(u) for u in users))
    watch, band = await orders.stock(WATCH), await orders.stock(BAND)
    outcomes = await asyncio.gather(*(orders.cancel_order(u, "88235", key()) for u in users))
    assert all(o.cancelled for o in outcomes)
    assert await orders.stock(WATCH) == watch + 5
    assert await orders.stock(BAND) == band + 5


async def test_unknown_sku_has_no_stock(orders: OrderSystem, seeded: str) -> None:
    assert await orders.stock("NO-SUCH-SKU") == 0
    assert await orders.stock(AIRPODS) >= INITIAL_STOCK


async def test_unknown_coupon_is_a_key_error(orders: OrderSystem, seeded: str) -> None:
    with pytest.raises(KeyError):
        await orders.coupon_status(seeded, "NO-SUCH-COUPON")


# ------------------------------------------------------------ PostgreSQL only


async def test_postgres_replicas_open_at_once_into_their_own_schema(
    postgres: EmbeddedPostgres,
) -> None:
    # A fresh database, so the replicas really race to create the schema.
    url = create_database(postgres, "orders_open_test")
    systems = [PostgresOrderSystem(url) for _ in range(3)]
    await asyncio.gather(*(s.open() for s in systems))
    try:
        await systems[0].ensure_seeded(f"user-{uuid.uuid4()}")
    finally:
        await asyncio.gather(*(s.close() for s in systems))
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables"
            " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        )
        tables = await cur.fetchall()
    assert {schema for schema, _ in tables} == {"demo_orders"}
    assert {name for _, name in tables} >= {
        "orders",
        "order_items",
        "stock",
        "coupons",
        "refunds",
        "cancellations",
    }
