"""The order demo: the source's e-commerce after-sales agent as a profile.

Registered as the profile `order_demo` (AGENT_PROFILE=order_demo); the demo,
the tests and the clients in other languages run the agent with it.
"""

from agentstate.examples.order_demo.profile import (
    OrderDemoProfile,
    OrderDemoSettings,
    create_profile,
)

__all__ = ["OrderDemoProfile", "OrderDemoSettings", "create_profile"]
