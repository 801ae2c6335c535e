"""The demo data every user starts with, shared by both implementations."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Final

from agentstate.examples.order_demo.orders.base import CouponStatus, Order, OrderItem, OrderStatus

# A fixed offset rather than ZoneInfo: no tzdata needed, and China has no DST.
SHANGHAI: Final = timezone(timedelta(hours=8), "Asia/Shanghai")

# Starting units per SKU, set only when the SKU has no stock row yet.
INITIAL_STOCK: Final = 50


@dataclass(frozen=True)
class SeedCoupon:
    coupon_id: str
    amount: Decimal  # the discount it gave
    status: CouponStatus
    order_no: str | None  # the order it was used on


def _at(year: int, month: int, day: int, hour: int, minute: int) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=SHANGHAI)


def _item(sku: str, name: str, quantity: int, unit_price: str) -> OrderItem:
    return OrderItem(sku=sku, name=name, quantity=quantity, unit_price=Decimal(unit_price))


# (order_no, status, paid_amount, coupon_id, placed_at, items); newest first.
_ORDERS: Final = (
    (
        "88240",
        OrderStatus.PAID_AWAITING_SHIPMENT,
        "129.00",
        None,
        _at(2026, 9, 20, 9, 12),
        (_item("USB-C-CABLE-1M", "USB-C 充电线", 2, "64.50"),),
    ),
    (
        "88239",
        OrderStatus.COMPLETED,
        "59.00",
        None,
        _at(2026, 9, 18, 20, 41),
        (_item("PHONE-CASE", "手机壳", 1, "59.00"),),
    ),
    (
        "88237",
        OrderStatus.SHIPPED,
        "899.00",
        None,
        _at(2026, 9, 15, 10, 3),
        (_item("AIRPODS-4", "AirPods 4", 1, "899.00"),),
    ),
    (
        "88235",
        OrderStatus.PAID_AWAITING_SHIPMENT,
        "3378.00",
        "CPN-88235",
        _at(2026, 9, 13, 14, 56),
        # 3199.00 + 279.00 = 3478.00 = 3378.00 paid + 100.00 coupon.
        (
            _item(
                "WATCH-S12-42-AL-GPS-SG",
                "Apple Watch Series 12 深空灰色 42 毫米 铝金属 GPS",
                1,
                "3199.00",
            ),
            _item("SPORT-BAND-42", "运动表带", 1, "279.00"),
        ),
    ),
    (
        "88230",
        OrderStatus.COMPLETED,
        "45.00",
        None,
        _at(2026, 9, 2, 18, 30),
        (_item("SCREEN-PROTECTOR", "屏幕贴膜", 1, "45.00"),),
    ),
)

DEMO_COUPONS: Final = (SeedCoupon("CPN-88235", Decimal("100.00"), CouponStatus.USED, "88235"),)


def demo_orders(user_id: str) -> list[Order]:
    """The five demo orders for one user, newest placed first."""
    return [
        Order(
            order_no=order_no,
            user_id=user_id,
            status=status,
            paid_amount=Decimal(paid),
            coupon_id=coupon_id,
            placed_at=placed_at,
            items=items,
        )
        for order_no, status, paid, coupon_id, placed_at, items in _ORDERS
    ]


def demo_skus() -> list[str]:
    """Every SKU the demo orders use, sorted (a fixed lock order for stock rows)."""
    return sorted({item.sku for *_, items in _ORDERS for item in items})
