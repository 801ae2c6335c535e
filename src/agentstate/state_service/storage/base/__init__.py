"""The store interface: the only way the state service reaches its data.

One small interface per aggregate (conversations, agent states, message records, run
leases) makes the core every backend writes; checkpoints and items are capabilities a
backend may add, and `features()` says which it has (the servicer answers UNIMPLEMENTED
for the others). Implementations: `PostgresStore` (production) and `MemoryStore` (demos
and fast tests); both pass the same behavioural suite. Every method is scoped by
user_id; another user's rows behave as if they did not exist. Arguments arrive already
validated (see state_service.domain) and are passed by keyword, so a call site says
what each id is.
"""

from __future__ import annotations

import enum

from agentstate.state_service.storage.base.checkpoints import CheckpointStore
from agentstate.state_service.storage.base.conversations import ConversationStore
from agentstate.state_service.storage.base.items import ItemStore
from agentstate.state_service.storage.base.leases import LeaseStore
from agentstate.state_service.storage.base.lifecycle import LifecycleStore
from agentstate.state_service.storage.base.messages import MessageStore
from agentstate.state_service.storage.base.states import AgentStateStore

__all__ = [
    "AgentStateStore",
    "CheckpointStore",
    "ConversationStore",
    "Feature",
    "ItemStore",
    "LeaseStore",
    "LifecycleStore",
    "MessageStore",
    "StateStore",
]


class Feature(enum.StrEnum):
    """An optional capability, named by the interface that provides it."""

    CHECKPOINTS = "checkpoints"  # CheckpointStore: LangGraph's saver
    ITEMS = "items"  # ItemStore: OpenAI Agents sessions, ADK events and scoped state


CAPABILITIES: dict[Feature, type] = {
    Feature.CHECKPOINTS: CheckpointStore,
    Feature.ITEMS: ItemStore,
}


class StateStore(ConversationStore, AgentStateStore, MessageStore, LeaseStore, LifecycleStore):
    """The core every backend implements, plus the capabilities it lists in features()."""

    def features(self) -> frozenset[Feature]:
        """The capabilities this store has: those whose interface it implements."""
        return frozenset(f for f, interface in CAPABILITIES.items() if isinstance(self, interface))

    async def open(self) -> None:
        """Prepare resources (connections, schema). Default: nothing."""

    async def close(self) -> None:
        """Release resources. Default: nothing."""
