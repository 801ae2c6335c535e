"""An in-memory order system for demos and fast tests. Data dies with the process.

One asyncio lock makes every operation atomic, which gives the same rules the
PostgreSQL implementation gets from its conditional update and transaction.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from decimal import Decimal

from agentstate.examples.order_demo.orders.base import (
    CancelOutcome,
    CouponStatus,
    Order,
    OrderStatus,
    OrderSystem,
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
    demo_orders,
    demo_skus,
)


class MemoryOrderSystem(OrderSystem):
    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._orders: dict[str, dict[str, Order]] = {}  # user_id -> order_no -> order
        self._stock: dict[str, int] = {}
        self._coupons: dict[tuple[str, str], CouponStatus] = {}
        self._refunds: dict[tuple[str, str], list[Decimal]] = {}
        self._cancellations: dict[tuple[str, str], CancelOutcome] = {}

    async def ensure_seeded(self, user_id: str) -> None:
        async with self._lock:
            if self._orders.get(user_id):
                return
            for sku in demo_skus():
                self._stock.setdefault(sku, INITIAL_STOCK)
            self._orders[user_id] = {o.order_no: o for o in demo_orders(user_id)}
            for coupon in DEMO_COUPONS:
                self._coupons[(user_id, coupon.coupon_id)] = coupon.status

    async def recent_orders(self, user_id: str, limit: int) -> list[Order]:
        check_limit(limit)
        async with self._lock:
            orders = list(self._orders.get(user_id, {}).values())
        orders.sort(key=lambda o: (o.placed_at, o.order_no), reverse=True)
        return orders[:limit]

    async def get_order(self, user_id: str, order_no: str) -> Order | None:
        async with self._lock:
            return self._orders.get(user_id, {}).get(order_no)

    async def cancel_order(
        self, user_id: str, order_no: str, idempotency_key: str
    ) -> CancelOutcome:
        check_idempotency_key(idempotency_key)
        async with self._lock:
            earlier = self._cancellations.get((user_id, idempotency_key))
            if earlier is not None:
                if earlier.order_no != order_no:
                    raise key_reused_error(idempotency_key, earlier.order_no, order_no)
                # A copy: the stored outcome's dict must not be reachable by callers.
                return replace(earlier, restored_stock=dict(earlier.restored_stock), replayed=True)
            outcome = self._cancel(user_id, order_no)
            self._cancellations[(user_id, idempotency_key)] = replace(
                outcome, restored_stock=dict(outcome.restored_stock)
            )
            return outcome

    def _cancel(self, user_id: str, order_no: str) -> CancelOutcome:
        """Apply one cancel; the caller holds the lock."""
        order = self._orders.get(user_id, {}).get(order_no)
        if order is None:
            return unknown_order(order_no)
        if order.status is not OrderStatus.PAID_AWAITING_SHIPMENT:
            return not_cancellable(order_no, order.status)
        self._orders[user_id][order_no] = replace(order, status=OrderStatus.CANCELLED)
        restored: dict[str, int] = {}
        for item in order.items:
            restored[item.sku] = restored.get(item.sku, 0) + item.quantity
        for sku, quantity in restored.items():
            self._stock[sku] = self._stock.get(sku, 0) + quantity
        coupon_returned = None
        coupon_key = (user_id, order.coupon_id or "")
        if order.coupon_id is not None and self._coupons.get(coupon_key) is CouponStatus.USED:
            self._coupons[coupon_key] = CouponStatus.AVAILABLE
            coupon_returned = order.coupon_id
        self._refunds.setdefault((user_id, order_no), []).append(order.paid_amount)
        return cancelled(order_no, order.paid_amount, restored, coupon_returned)

    async def stock(self, sku: str) -> int:
        async with self._lock:
            return self._stock.get(sku, 0)

    async def coupon_status(self, user_id: str, coupon_id: str) -> CouponStatus:
        async with self._lock:
            status = self._coupons.get((user_id, coupon_id))
        if status is None:
            raise KeyError(f"user has no coupon {coupon_id}")
        return status

    async def refunds(self, user_id: str, order_no: str) -> list[Decimal]:
        async with self._lock:
            return list(self._refunds.get((user_id, order_no), []))
