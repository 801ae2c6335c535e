"""The order_demo profile: its prompt, order tools, handbook, scripted model and order system."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field

from agentstate.agent_service.model.base import ChatModel
from agentstate.agent_service.profile import Profile
from agentstate.agent_service.tools.registry import Tool
from agentstate.agent_service.tools.skills import read_skills
from agentstate.common.config import EnvSettings
from agentstate.examples.order_demo.model import ScriptedOrderModel
from agentstate.examples.order_demo.orders import (
    MemoryOrderSystem,
    OrderSystem,
    PostgresOrderSystem,
)
from agentstate.examples.order_demo.tools import cancel_order_tool, query_order_tool

SYSTEM_PROMPT = (
    "你是电商平台的售后助手。按需加载业务手册（load_skill）并严格按手册步骤办事；"
    "只根据工具返回和对话里已有的信息回答，不编造订单信息；"
    "会改变订单的操作需要用户在确认卡片上确认。"
)


class OrderDemoSettings(EnvSettings):
    """The profile's own settings, read from the agent's environment
    (docs/reference/settings.md)."""

    database_url: str = Field(
        default="",
        validation_alias="ORDERS_DATABASE_URL",
        description=(
            "the order system's PostgreSQL (its own schema, demo_orders); empty keeps it in memory"
        ),
    )


class OrderDemoProfile(Profile):
    name = "order_demo"
    system_prompt = SYSTEM_PROMPT

    def __init__(
        self, settings: OrderDemoSettings | None = None, orders: OrderSystem | None = None
    ) -> None:
        self.settings = settings or OrderDemoSettings()
        if orders is None:
            url = self.settings.database_url
            orders = PostgresOrderSystem(url) if url else MemoryOrderSystem()
        self.orders = orders
        self._tools = (query_order_tool(orders), cancel_order_tool(orders))
        self._skills = read_skills("agentstate.examples.order_demo.skills")

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def skills(self) -> Mapping[str, str]:
        return self._skills

    def scripted_model(self, step_delay_seconds: float = 0.0) -> ChatModel:
        return ScriptedOrderModel(step_delay_seconds)

    async def open(self) -> None:
        await self.orders.open()

    async def close(self) -> None:
        await self.orders.close()


def create_profile(env: Mapping[str, str]) -> OrderDemoProfile:
    """The factory AGENT_PROFILE=order_demo names (entry point agentstate.profiles)."""
    return OrderDemoProfile(OrderDemoSettings.from_env(env))
