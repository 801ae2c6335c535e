"""The PostgreSQL order system: psycopg 3 with an async connection pool.

Every table lives in its own schema, `demo_orders`, and every statement names
it: the demo backend never reads or writes the agent-state tables, even when
it shares their database. Connections run in autocommit; each write is one
explicit transaction (`conn.transaction()`).
"""

from __future__ import annotations

import contextlib
from decimal import Decimal
from typing import Any, Final

from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from agentstate.common.pg_pool import Conn, GuardedPool
from agentstate.examples.order_demo.orders.base import (
    CancelOutcome,
    CouponStatus,
    Order,
    OrderItem,
    OrderStatus,
    OrderSystem,
    OrderSystemUnavailable,
    cancelled,
    check_idempotency_key,
    check_limit,
    key_reused_error,
    not_cancellable,
    unknown_order,
)
from agentstate.examples.order_demo.orders.seed import (
    DEMO_COUPONS,
    INITIAL_STOCK,
    SHANGHAI,
    demo_orders,
    demo_skus,
)

# Arbitrary constant, distinct from the state service's migration lock: serialises
# schema creation so two replicas opening at once cannot race on CREATE ... IF NOT EXISTS.
SCHEMA_LOCK_ID: Final = 0x6465_6D6F_6F72_6431  # "demoord1"

# ---------------------------------------------------------------------- schema

CREATE_SCHEMA: Final = """
CREATE SCHEMA IF NOT EXISTS demo_orders;

-- One row per user who got the demo orders: the claim that makes seeding run once.
CREATE TABLE IF NOT EXISTS demo_orders.seeded_users (
    user_id    text PRIMARY KEY,
    seeded_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS demo_orders.orders (
    user_id      text NOT NULL,
    order_no     text NOT NULL,
    status       text NOT NULL CHECK (status IN
                     ('PAID_AWAITING_SHIPMENT', 'SHIPPED', 'COMPLETED', 'CANCELLED')),
    paid_amount  numeric(12, 2) NOT NULL CHECK (paid_amount >= 0),
    coupon_id    text,
    placed_at    timestamptz NOT NULL,
    cancelled_at timestamptz,
    PRIMARY KEY (user_id, order_no)
);
CREATE INDEX IF NOT EXISTS orders_recent_idx
    ON demo_orders.orders (user_id, placed_at DESC, order_no DESC);

CREATE TABLE IF NOT EXISTS demo_orders.order_items (
    user_id     text NOT NULL,
    order_no    text NOT NULL,
    line_no     integer NOT NULL,
    sku         text NOT NULL,
    name        text NOT NULL,
    quantity    integer NOT NULL CHECK (quantity > 0),
    unit_price  numeric(12, 2) NOT NULL CHECK (unit_price >= 0),
    PRIMARY KEY (user_id, order_no, line_no),
    FOREIGN KEY (user_id, order_no) REFERENCES demo_orders.orders (user_id, order_no)
);

-- Global per SKU, shared by every user.
CREATE TABLE IF NOT EXISTS demo_orders.stock (
    sku       text PRIMARY KEY,
    quantity  integer NOT NULL CHECK (quantity >= 0)
);

CREATE TABLE IF NOT EXISTS demo_orders.coupons (
    user_id    text NOT NULL,
    coupon_id  text NOT NULL,
    amount     numeric(12, 2) NOT NULL CHECK (amount > 0),
    status     text NOT NULL CHECK (status IN ('USED', 'AVAILABLE')),
    order_no   text,
    PRIMARY KEY (user_id, coupon_id)
);

CREATE TABLE IF NOT EXISTS demo_orders.refunds (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id      text NOT NULL,
    order_no     text NOT NULL,
    amount       numeric(12, 2) NOT NULL CHECK (amount > 0),
    destination  text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (user_id, order_no) REFERENCES demo_orders.orders (user_id, order_no)
);

-- Keys are scoped by user so one user's tool-call id can never replay another's outcome.
-- outcome is NULL only inside the transaction that claimed the key.
CREATE TABLE IF NOT EXISTS demo_orders.cancellations (
    user_id          text NOT NULL,
    idempotency_key  text NOT NULL,
    order_no         text NOT NULL,
    outcome          jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, idempotency_key)
);
"""

# --------------------------------------------------------------------- seeding

# Taken before anything else: a concurrent seeder of the same user waits here
# for the first to commit, then finds the row and does nothing.
CLAIM_SEED: Final = """
INSERT INTO demo_orders.seeded_users (user_id) VALUES (%(user_id)s)
ON CONFLICT (user_id) DO NOTHING
RETURNING user_id
"""

SEED_STOCK: Final = """
INSERT INTO demo_orders.stock (sku, quantity) VALUES (%(sku)s, %(quantity)s)
ON CONFLICT (sku) DO NOTHING
"""

INSERT_ORDER: Final = """
INSERT INTO demo_orders.orders (user_id, order_no, status, paid_amount, coupon_id, placed_at)
VALUES (%(user_id)s, %(order_no)s, %(status)s, %(paid_amount)s, %(coupon_id)s, %(placed_at)s)
"""

INSERT_ORDER_ITEM: Final = """
INSERT INTO demo_orders.order_items
    (user_id, order_no, line_no, sku, name, quantity, unit_price)
VALUES (%(user_id)s, %(order_no)s, %(line_no)s, %(sku)s, %(name)s, %(quantity)s, %(unit_price)s)
"""

INSERT_COUPON: Final = """
INSERT INTO demo_orders.coupons (user_id, coupon_id, amount, status, order_no)
VALUES (%(user_id)s, %(coupon_id)s, %(amount)s, %(status)s, %(order_no)s)
"""

# --------------------------------------------------------------------- reading

_ORDER_WITH_ITEMS: Final = """
SELECT o.order_no, o.status, o.paid_amount, o.coupon_id, o.placed_at,
       i.sku, i.name, i.quantity, i.unit_price
FROM selected o
LEFT JOIN demo_orders.order_items i ON i.user_id = o.user_id AND i.order_no = o.order_no
ORDER BY o.placed_at DESC, o.order_no DESC, i.line_no
"""

# One statement, so the orders and their items come from one snapshot.
RECENT_ORDERS: Final = f"""
WITH selected AS (
    SELECT user_id, order_no, status, paid_amount, coupon_id, placed_at
    FROM demo_orders.orders
    WHERE user_id = %(user_id)s
    ORDER BY placed_at DESC, order_no DESC
    LIMIT %(limit)s
)
{_ORDER_WITH_ITEMS}
"""

SELECT_ORDER: Final = f"""
WITH selected AS (
    SELECT user_id, order_no, status, paid_amount, coupon_id, placed_at
    FROM demo_orders.orders
    WHERE user_id = %(user_id)s AND order_no = %(order_no)s
)
{_ORDER_WITH_ITEMS}
"""

SELECT_STOCK: Final = "SELECT quantity FROM demo_orders.stock WHERE sku = %(sku)s"

SELECT_COUPON_STATUS: Final = """
SELECT status FROM demo_orders.coupons WHERE user_id = %(user_id)s AND coupon_id = %(coupon_id)s
"""

SELECT_REFUNDS: Final = """
SELECT amount FROM demo_orders.refunds
WHERE user_id = %(user_id)s AND order_no = %(order_no)s
ORDER BY id
"""

# ---------------------------------------------------------------------- cancel

# Claims the key first: a concurrent call with the same key waits here until
# the first commits, then conflicts and replays its outcome.
CLAIM_IDEMPOTENCY_KEY: Final = """
INSERT INTO demo_orders.cancellations (user_id, idempotency_key, order_no)
VALUES (%(user_id)s, %(idempotency_key)s, %(order_no)s)
ON CONFLICT (user_id, idempotency_key) DO NOTHING
RETURNING idempotency_key
"""

SELECT_CANCELLATION: Final = """
SELECT order_no, outcome FROM demo_orders.cancellations
WHERE user_id = %(user_id)s AND idempotency_key = %(idempotency_key)s
"""

RECORD_OUTCOME: Final = """
UPDATE demo_orders.cancellations SET outcome = %(outcome)s
WHERE user_id = %(user_id)s AND idempotency_key = %(idempotency_key)s
"""

# The whole decision in one conditional update: concurrent cancels queue on the
# row lock and re-check the status, so exactly one of them matches.
CANCEL_IF_AWAITING_SHIPMENT: Final = """
UPDATE demo_orders.orders SET status = 'CANCELLED', cancelled_at = now()
WHERE user_id = %(user_id)s AND order_no = %(order_no)s AND status = 'PAID_AWAITING_SHIPMENT'
RETURNING paid_amount, coupon_id
"""

SELECT_ORDER_STATUS: Final = """
SELECT status FROM demo_orders.orders WHERE user_id = %(user_id)s AND order_no = %(order_no)s
"""

# Sorted by SKU: stock rows are shared, and a fixed lock order rules out deadlocks
# between cancels of different orders holding the same SKUs.
SELECT_ORDER_QUANTITIES: Final = """
SELECT sku, sum(quantity) FROM demo_orders.order_items
WHERE user_id = %(user_id)s AND order_no = %(order_no)s
GROUP BY sku
ORDER BY sku
"""

RESTORE_STOCK: Final = """
INSERT INTO demo_orders.stock (sku, quantity) VALUES (%(sku)s, %(quantity)s)
ON CONFLICT (sku) DO UPDATE SET quantity = demo_orders.stock.quantity + EXCLUDED.quantity
"""

RETURN_COUPON: Final = """
UPDATE demo_orders.coupons SET status = 'AVAILABLE', order_no = NULL
WHERE user_id = %(user_id)s AND coupon_id = %(coupon_id)s AND status = 'USED'
RETURNING coupon_id
"""

INSERT_REFUND: Final = """
INSERT INTO demo_orders.refunds (user_id, order_no, amount, destination)
VALUES (%(user_id)s, %(order_no)s, %(amount)s, 'ORIGINAL_PAYMENT_METHOD')
"""


def _orders(user_id: str, rows: list[tuple[Any, ...]]) -> list[Order]:
    """Fold joined order/item rows (grouped by order, in order) into Orders."""
    heads: dict[str, tuple[Any, ...]] = {}
    items: dict[str, list[OrderItem]] = {}
    for row in rows:
        order_no = row[0]
        if order_no not in heads:
            heads[order_no] = row
            items[order_no] = []
        if row[5] is not None:
            items[order_no].append(
                OrderItem(sku=row[5], name=row[6], quantity=int(row[7]), unit_price=row[8])
            )
    return [
        Order(
            order_no=order_no,
            user_id=user_id,
            status=OrderStatus(head[1]),
            paid_amount=head[2],
            coupon_id=head[3],
            placed_at=head[4].astimezone(SHANGHAI),
            items=tuple(items[order_no]),
        )
        for order_no, head in heads.items()
    ]


class PostgresOrderSystem(OrderSystem):
    def __init__(
        self,
        conninfo: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 5.0,
        connect_timeout: float = 30.0,
    ) -> None:
        self._pool = GuardedPool(
            AsyncConnectionPool(
                conninfo,
                min_size=min_size,
                max_size=max_size,
                timeout=timeout,
                open=False,
                kwargs={"row_factory": tuple_row, "autocommit": True},
                name="agentstate-demo-orders",
            ),
            what="order database",
            unavailable=OrderSystemUnavailable,
            connect_timeout=connect_timeout,
        )

    async def open(self) -> None:
        await self._pool.open()
        async with self._connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_ID,))
            await conn.execute(CREATE_SCHEMA)

    async def close(self) -> None:
        await self._pool.close()

    def _connection(self) -> contextlib.AbstractAsyncContextManager[Conn]:
        """A pooled connection; database outages become OrderSystemUnavailable."""
        return self._pool.connection()

    async def ensure_seeded(self, user_id: str) -> None:
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(CLAIM_SEED, {"user_id": user_id})
            if await cur.fetchone() is None:
                return
            async with conn.cursor() as cur:
                # Sorted SKUs: the same insert order in every seeder, so no deadlocks.
                await cur.executemany(
                    SEED_STOCK, [{"sku": sku, "quantity": INITIAL_STOCK} for sku in demo_skus()]
                )
                orders = demo_orders(user_id)
                await cur.executemany(
                    INSERT_ORDER,
                    [
                        {
                            "user_id": user_id,
                            "order_no": o.order_no,
                            "status": o.status.value,
                            "paid_amount": o.paid_amount,
                            "coupon_id": o.coupon_id,
                            "placed_at": o.placed_at,
                        }
                        for o in orders
                    ],
                )
                await cur.executemany(
                    INSERT_ORDER_ITEM,
                    [
                        {
                            "user_id": user_id,
                            "order_no": o.order_no,
                            "line_no": line_no,
                            "sku": item.sku,
                            "name": item.name,
                            "quantity": item.quantity,
                            "unit_price": item.unit_price,
                        }
                        for o in orders
                        for line_no, item in enumerate(o.items, start=1)
                    ],
                )
                await cur.executemany(
                    INSERT_COUPON,
                    [
                        {
                            "user_id": user_id,
                            "coupon_id": c.coupon_id,
                            "amount": c.amount,
                            "status": c.status.value,
                            "order_no": c.order_no,
                        }
                        for c in DEMO_COUPONS
                    ],
                )

    async def recent_orders(self, user_id: str, limit: int) -> list[Order]:
        check_limit(limit)
        async with self._connection() as conn:
            cur = await conn.execute(RECENT_ORDERS, {"user_id": user_id, "limit": limit})
            rows = await cur.fetchall()
        return _orders(user_id, rows)

    async def get_order(self, user_id: str, order_no: str) -> Order | None:
        async with self._connection() as conn:
            cur = await conn.execute(SELECT_ORDER, {"user_id": user_id, "order_no": order_no})
            rows = await cur.fetchall()
        found = _orders(user_id, rows)
        return found[0] if found else None

    async def cancel_order(
        self, user_id: str, order_no: str, idempotency_key: str
    ) -> CancelOutcome:
        check_idempotency_key(idempotency_key)
        params = {"user_id": user_id, "order_no": order_no, "idempotency_key": idempotency_key}
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(CLAIM_IDEMPOTENCY_KEY, params)
            if await cur.fetchone() is None:
                cur = await conn.execute(SELECT_CANCELLATION, params)
                row = await cur.fetchone()
                assert row is not None  # the conflicting row is committed and never deleted
                if row[0] != order_no:
                    raise key_reused_error(idempotency_key, row[0], order_no)
                return CancelOutcome.from_json(row[1], replayed=True)
            outcome = await self._cancel(conn, user_id, order_no)
            await conn.execute(RECORD_OUTCOME, {**params, "outcome": Jsonb(outcome.to_json())})
        return outcome

    async def _cancel(self, conn: Conn, user_id: str, order_no: str) -> CancelOutcome:
        """Apply one cancel inside the caller's transaction."""
        params = {"user_id": user_id, "order_no": order_no}
        cur = await conn.execute(CANCEL_IF_AWAITING_SHIPMENT, params)
        row = await cur.fetchone()
        if row is None:
            cur = await conn.execute(SELECT_ORDER_STATUS, params)
            current = await cur.fetchone()
            if current is None:
                return unknown_order(order_no)
            return not_cancellable(order_no, OrderStatus(current[0]))
        paid_amount: Decimal = row[0]
        coupon_id: str | None = row[1]
        cur = await conn.execute(SELECT_ORDER_QUANTITIES, params)
        restored = {str(sku): int(quantity) for sku, quantity in await cur.fetchall()}
        for sku, quantity in restored.items():
            await conn.execute(RESTORE_STOCK, {"sku": sku, "quantity": quantity})
        coupon_returned = None
        if coupon_id is not None:
            cur = await conn.execute(RETURN_COUPON, {**params, "coupon_id": coupon_id})
            if await cur.fetchone() is not None:
                coupon_returned = coupon_id
        await conn.execute(INSERT_REFUND, {**params, "amount": paid_amount})
        return cancelled(order_no, paid_amount, restored, coupon_returned)

    async def stock(self, sku: str) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(SELECT_STOCK, {"sku": sku})
            row = await cur.fetchone()
        return 0 if row is None else int(row[0])

    async def coupon_status(self, user_id: str, coupon_id: str) -> CouponStatus:
        async with self._connection() as conn:
            cur = await conn.execute(
                SELECT_COUPON_STATUS, {"user_id": user_id, "coupon_id": coupon_id}
            )
            row = await cur.fetchone()
        if row is None:
            raise KeyError(f"user has no coupon {coupon_id}")
        return CouponStatus(row[0])

    async def refunds(self, user_id: str, order_no: str) -> list[Decimal]:
        async with self._connection() as conn:
            cur = await conn.execute(SELECT_REFUNDS, {"user_id": user_id, "order_no": order_no})
            return [row[0] for row in await cur.fetchall()]
