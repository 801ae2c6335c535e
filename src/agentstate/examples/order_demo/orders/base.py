"""The order system interface: the business backend the agent's order tools call.

This is a demo stand-in for a real order service. Implementations:
`PostgresOrderSystem` (its own `demo_orders` schema, never the agent-state
tables) and `MemoryOrderSystem` (demos and fast tests). Both pass the same
behavioural test suite. Every method is scoped by user_id; another user's
orders behave as if they did not exist.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

MAX_RECENT_ORDERS = 20


class OrderStatus(StrEnum):
    PAID_AWAITING_SHIPMENT = "PAID_AWAITING_SHIPMENT"
    SHIPPED = "SHIPPED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"

    @property
    def label(self) -> str:
        """The name the user sees (the product speaks Chinese)."""
        return _STATUS_LABELS[self]


_STATUS_LABELS: dict[OrderStatus, str] = {
    OrderStatus.PAID_AWAITING_SHIPMENT: "已支付待发货",
    OrderStatus.SHIPPED: "已发货",
    OrderStatus.COMPLETED: "已完成",
    OrderStatus.CANCELLED: "已取消",
}


class CouponStatus(StrEnum):
    USED = "USED"
    AVAILABLE = "AVAILABLE"


class OrderSystemUnavailable(Exception):
    """The backend could not be reached; nothing was changed."""


@dataclass(frozen=True)
class OrderItem:
    sku: str
    name: str
    quantity: int
    unit_price: Decimal


@dataclass(frozen=True)
class Order:
    order_no: str
    user_id: str
    status: OrderStatus
    paid_amount: Decimal
    coupon_id: str | None
    placed_at: datetime
    items: tuple[OrderItem, ...]


@dataclass(frozen=True)
class CancelOutcome:
    order_no: str
    cancelled: bool
    reason: str
    refund_amount: Decimal | None = None
    restored_stock: dict[str, int] = field(default_factory=dict)  # sku -> quantity put back
    coupon_returned: str | None = None
    replayed: bool = False  # True when this is the stored outcome of an earlier call

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe form for storing under the idempotency key (amounts as strings)."""
        return {
            "order_no": self.order_no,
            "cancelled": self.cancelled,
            "reason": self.reason,
            "refund_amount": None if self.refund_amount is None else str(self.refund_amount),
            "restored_stock": dict(self.restored_stock),
            "coupon_returned": self.coupon_returned,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, replayed: bool) -> CancelOutcome:
        refund = data.get("refund_amount")
        return cls(
            order_no=str(data["order_no"]),
            cancelled=bool(data["cancelled"]),
            reason=str(data["reason"]),
            refund_amount=None if refund is None else Decimal(str(refund)),
            restored_stock={str(k): int(v) for k, v in data.get("restored_stock", {}).items()},
            coupon_returned=data.get("coupon_returned"),
            replayed=replayed,
        )


def check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_RECENT_ORDERS:
        raise ValueError(f"limit must be between 1 and {MAX_RECENT_ORDERS}, got {limit}")


def check_idempotency_key(idempotency_key: str) -> None:
    if not idempotency_key:
        raise ValueError("idempotency_key must not be empty")


def key_reused_error(idempotency_key: str, first_order_no: str, order_no: str) -> ValueError:
    # A key names one call; replaying another order's outcome would mislead the agent.
    return ValueError(
        f"idempotency_key {idempotency_key!r} was already used to cancel order "
        f"{first_order_no}, not {order_no}"
    )


def unknown_order(order_no: str) -> CancelOutcome:
    return CancelOutcome(order_no=order_no, cancelled=False, reason=f"未找到订单 {order_no}")


def not_cancellable(order_no: str, status: OrderStatus) -> CancelOutcome:
    return CancelOutcome(
        order_no=order_no,
        cancelled=False,
        reason=(
            f"订单 {order_no} 当前状态为{status.label}，"
            f"只有{OrderStatus.PAID_AWAITING_SHIPMENT.label}的订单可以取消"
        ),
    )


def cancelled(
    order_no: str, refund: Decimal, restored_stock: dict[str, int], coupon_returned: str | None
) -> CancelOutcome:
    reason = f"订单 {order_no} 已取消，{refund} 元将原路退回"
    if coupon_returned is not None:
        reason += f"，优惠券 {coupon_returned} 已退回"
    return CancelOutcome(
        order_no=order_no,
        cancelled=True,
        reason=reason,
        refund_amount=refund,
        restored_stock=restored_stock,
        coupon_returned=coupon_returned,
    )


class OrderSystem(abc.ABC):
    async def open(self) -> None:
        """Connect and prepare storage; a no-op where there is nothing to open."""
        return None  # deliberately concrete: not every backend has anything to open

    async def close(self) -> None:
        """Release connections; a no-op where there is nothing to close."""
        return None

    @abc.abstractmethod
    async def ensure_seeded(self, user_id: str) -> None:
        """Give the user the five demo orders if they have none.

        Idempotent and safe to call concurrently: a user is seeded exactly once,
        and a later cancel is never undone by seeding again.
        """

    @abc.abstractmethod
    async def recent_orders(self, user_id: str, limit: int) -> list[Order]:
        """Newest placed first. ValueError unless 1 <= limit <= 20."""

    @abc.abstractmethod
    async def get_order(self, user_id: str, order_no: str) -> Order | None: ...

    @abc.abstractmethod
    async def cancel_order(
        self, user_id: str, order_no: str, idempotency_key: str
    ) -> CancelOutcome:
        """Cancel an order still awaiting shipment, atomically.

        On success stock is restored for every item, the used coupon is
        returned and the paid amount is refunded to the original payment
        method. Any outcome, refusals included, is stored under
        idempotency_key in the same transaction: a second call with that key
        returns it with replayed=True and changes nothing. ValueError when the
        key is empty or was used for a different order.
        """

    @abc.abstractmethod
    async def stock(self, sku: str) -> int:
        """Units on hand (global per SKU); 0 for an unknown SKU."""

    @abc.abstractmethod
    async def coupon_status(self, user_id: str, coupon_id: str) -> CouponStatus:
        """KeyError when the user has no such coupon."""

    @abc.abstractmethod
    async def refunds(self, user_id: str, order_no: str) -> list[Decimal]:
        """Refunded amounts for the order, oldest first."""
