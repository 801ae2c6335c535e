"""The demo order system the agent's order tools call (a stand-in business backend)."""

from agentstate.examples.order_demo.orders.base import (
    CancelOutcome,
    CouponStatus,
    Order,
    OrderItem,
    OrderStatus,
    OrderSystem,
    OrderSystemUnavailable,
)
from agentstate.examples.order_demo.orders.memory import MemoryOrderSystem
from agentstate.examples.order_demo.orders.postgres import PostgresOrderSystem

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
