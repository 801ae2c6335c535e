"""An in-memory store for demos and fast tests. Data dies with the process.

It keeps the PostgreSQL store's rules and stores payloads in the same form (the domain's
jsontext and StateForm), so the shared behavioural suite holds for both and GetState
answers with the same bytes. One asyncio
lock makes every operation atomic; each write validates everything before it
changes anything, so a failed call leaves no trace.
"""

from __future__ import annotations

from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.memory.checkpoints import MemoryCheckpoints
from agentstate.state_service.storage.memory.conversations import MemoryConversations
from agentstate.state_service.storage.memory.items import MemoryItems
from agentstate.state_service.storage.memory.leases import MemoryLeases
from agentstate.state_service.storage.memory.lifecycle import MemoryLifecycle
from agentstate.state_service.storage.memory.messages import MemoryMessages
from agentstate.state_service.storage.memory.states import MemoryStates
from agentstate.state_service.storage.memory.tables import IdGenerator

__all__ = ["IdGenerator", "MemoryStore"]


class MemoryStore(
    MemoryConversations,
    MemoryStates,
    MemoryMessages,
    MemoryLeases,
    MemoryCheckpoints,
    MemoryItems,
    MemoryLifecycle,
    StateStore,
):
    """Every aggregate and both capabilities, in one process's memory."""
