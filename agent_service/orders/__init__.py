"""The demo order system the agent's order tools call (a stand-in business backend)."""

from agent_service.orders.base import (
    CancelOutcome,
    CouponStatus,
    Order,
    OrderItem,
    OrderStatus,
    OrderSystem,
    OrderSystemUnavailable,
)
from agent_service.orders.memory import MemoryOrderSystem
from agent_service.orders.postgres import PostgresOrderSystem

__all__ = [
    "CancelOutcome",
    "CouponStatus",
    "MemoryOrderSystem",
    "Order",
    "OrderItem",
    "OrderStatus",
    "OrderSystem",
    "OrderSystemUnavailable",
    "PostgresOrderSystem",
]
