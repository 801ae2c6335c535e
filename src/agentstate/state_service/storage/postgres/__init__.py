"""The PostgreSQL store: psycopg 3 with an async connection pool.

One RPC, one statement, one round trip: connections are in autocommit and the
writes that take several steps run as PL/pgSQL functions (functions/*.sql, installed
by migrations.py), each its own transaction. A function refuses with SQLSTATE AS000
and a JSON detail; refusals.py turns that into the domain's error. Every write that
touches a conversation first takes its row lock, which is what makes compare-and-set,
no-resurrection and atomic delete hold across replicas. One module per aggregate; the
store is their sum over one pool (connection.py).
"""

from __future__ import annotations

from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.postgres.checkpoints import PostgresCheckpoints
from agentstate.state_service.storage.postgres.connection import MisconfiguredStore
from agentstate.state_service.storage.postgres.conversations import PostgresConversations
from agentstate.state_service.storage.postgres.items import PostgresItems
from agentstate.state_service.storage.postgres.leases import PostgresLeases
from agentstate.state_service.storage.postgres.lifecycle import PostgresLifecycle
from agentstate.state_service.storage.postgres.messages import PostgresMessages
from agentstate.state_service.storage.postgres.states import PostgresStates

__all__ = ["MisconfiguredStore", "PostgresStore"]


class PostgresStore(
    PostgresConversations,
    PostgresStates,
    PostgresMessages,
    PostgresLeases,
    PostgresCheckpoints,
    PostgresItems,
    PostgresLifecycle,
    StateStore,
):
    """Every aggregate and both capabilities, on one pool."""
