"""A turn's run lease: taken when the turn starts, kept alive while it runs, released
when it ends (by its save, or here when the save did not).

One turn per conversation across replicas; a Stop requested on any replica reaches
the holder through its heartbeat. While this replica drains (SIGTERM) it starts no
turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from opentelemetry import trace

from agentstate.agent_service import errors
from agentstate.agent_service.records import LoadedTurn
from agentstate.agent_service.runtime import texts
from agentstate.agent_service.runtime.port import StatePort
from agentstate.agent_service.telemetry import LEASE_CONFLICTS
from agentstate.agent_service.turns import TurnControl, TurnRegistry
from agentstate.client.types import TurnRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    """The runtime's lease settings (declared for operators in agent_service/config.py)."""

    holder: str = "agent"  # this replica's name, recorded on leases
    ttl_ms: int = 15_000
    renew_seconds: float = 2.0
    max_turns_per_user: int = 5


class TurnLeases:
    def __init__(self, state: StatePort, settings: LeaseSettings, registry: TurnRegistry) -> None:
        self._state = state
        self.settings = settings
        self._registry = registry

    def ensure_accepting(self) -> None:
        if self._registry.draining:
            raise errors.Unavailable(texts.DRAINING)

    @contextlib.asynccontextmanager
    async def turn(self, request: TurnRequest) -> AsyncIterator[tuple[TurnControl, LoadedTurn]]:
        """Start the turn (one state call: lease, records, state) and hold its lease."""
        self.ensure_accepting()
        try:
            begun = await self._state.begin_turn(request)
        except errors.Conflict as exc:
            if not isinstance(exc, errors.CardPending):
                LEASE_CONFLICTS.add(1)
            raise
        control = TurnControl(request.user_id, begun.conversation_id, begun.task_id)
        control.repaired_records = begun.interrupted_records
        if begun.interrupted_records:
            log.warning(
                "conversation %s: marked %d records of a turn that never finished as interrupted",
                begun.conversation_id,
                begun.interrupted_records,
            )
        span = trace.get_current_span()
        span.set_attribute("agentstate.conversation_id", begun.conversation_id)
        span.set_attribute("agentstate.task_id", control.task_id)
        task = asyncio.current_task()
        assert task is not None
        self._registry.add(control, task)
        heartbeat = asyncio.create_task(self._heartbeat(control))
        try:
            yield control, begun
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            if not control.released:
                try:
                    release = self._state.release_lease(request.user_id, control.task_id)
                    await asyncio.shield(release)
                except errors.AgentError as exc:
                    # It lapses by itself after its ttl.
                    log.warning("could not release lease of task %s: %s", control.task_id, exc)

    async def _heartbeat(self, control: TurnControl) -> None:
        """Keep the lease alive; pick up Stop requests made on any replica."""
        while True:
            await asyncio.sleep(self.settings.renew_seconds)
            try:
                lease = await self._state.renew_lease(
                    control.user_id, control.task_id, self.settings.ttl_ms
                )
            except errors.Conflict:
                control.request_stop(texts.LEASE_LOST)
                return
            except errors.AgentError as exc:
                log.warning("lease renewal failed for task %s: %s", control.task_id, exc)
                continue
            if lease.stop_requested:
                control.request_stop(texts.STOPPED_BY_USER)
