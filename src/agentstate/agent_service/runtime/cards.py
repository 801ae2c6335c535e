"""Confirmation cards: a typed Card and the rules that settle one exactly once.

A card is stored twice, in the same save: in the state, on the assistant message
whose tool calls wait (metadata key "confirm"), and on that turn's reply record
(metadata {"card": ...}) for the UI. A tool_use with no tool_result is pending;
the card says until when it can be answered. The JSON shape is the one earlier
versions stored, so cards saved by them still load.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from agentstate.agent_service.agent_state import (
    PERMISSION_DENIED_TEXT,
    AgentState,
    Msg,
    Role,
    ToolResultBlock,
    ToolResultState,
    ToolUseBlock,
)
from agentstate.agent_service.runtime import outcomes, texts
from agentstate.client.types import MessageStatus, MessageUpdate, MessageWrite

log = logging.getLogger(__name__)

CARD_METADATA_KEY = outcomes.CARD_METADATA_KEY
# On the confirmation message (never in the model context): [{call_id, approved}].
CONFIRM_RESULTS_KEY = "confirm_results"


class CardStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"


@dataclass(frozen=True)
class CardEntry:
    """One call on a card, as the UI shows it."""

    call_id: str
    name: str
    title: str
    fields: list[tuple[str, str]]


@dataclass(frozen=True)
class Card:
    record_id: str  # the reply record that shows it; Confirm names the card by this id
    title: str
    expires_at: datetime
    status: CardStatus
    calls: list[CardEntry]

    def expired(self, now: datetime) -> bool:
        return self.expires_at <= now

    def settled(self, status: CardStatus) -> Card:
        return replace(self, status=status)

    def to_json(self) -> dict[str, Any]:
        return {
            "record_id": self.record_id,
            "title": self.title,
            "expires_at": self.expires_at.isoformat(),
            "status": self.status.value,
            "calls": [
                {"call_id": c.call_id, "name": c.name, "title": c.title, "fields": c.fields}
                for c in self.calls
            ],
        }

    @classmethod
    def of(cls, msg: Msg) -> Card | None:
        """The card on a message; None when it has none of ours (say, another runtime's)
        or one that does not decode (logged: its calls then count as expired)."""
        data = msg.metadata.get(CARD_METADATA_KEY)
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                record_id=str(data["record_id"]),
                title=str(data.get("title", "")),
                expires_at=datetime.fromisoformat(str(data["expires_at"])),
                status=CardStatus(data.get("status", CardStatus.PENDING)),
                calls=[
                    CardEntry(
                        call_id=str(c["call_id"]),
                        name=str(c["name"]),
                        title=str(c.get("title", "")),
                        fields=[(str(k), str(v)) for k, v in c.get("fields", [])],
                    )
                    for c in data.get("calls", [])
                ],
            )
        except (KeyError, TypeError, ValueError) as exc:
            log.warning(
                "the card on message %s does not decode (%s: %s); its calls count as expired",
                msg.id,
                type(exc).__name__,
                exc,
                extra={"message_id": msg.id},
            )
            return None


@dataclass(frozen=True)
class WaitingCalls:
    """The calls still waiting in a state, and the card that asked for them (not the
    BeginTurn guard `agentstate.client.types.OpenCard`, which names a card's record)."""

    message: Msg  # the assistant message holding the calls
    card: Card | None  # None: pending calls with no card of ours (they count as expired)
    calls: list[ToolUseBlock]

    def expired(self, now: datetime) -> bool:
        return self.card is None or self.card.expired(now)

    def is_card(self, record_id: str) -> bool:
        return self.card is not None and self.card.record_id == record_id


def waiting_calls(state: AgentState) -> WaitingCalls | None:
    """The calls of `state` that have no result yet, or None."""
    pending = state.pending_calls()
    if not pending:
        return None
    message = pending[0][0]
    return WaitingCalls(message, Card.of(message), [call for _, call in pending])


def now() -> datetime:
    return datetime.now(UTC)


def settle_expired(state: AgentState, waiting: WaitingCalls) -> list[MessageWrite]:
    """Answer every pending call of an expired card as not executed; the record
    write that marks its card expired (none when it has no card of ours)."""
    for call in waiting.calls:
        state.context.append(
            Msg(
                role=Role.TOOL,
                content=[
                    ToolResultBlock.of_text(
                        call.id, call.name, ToolResultState.INTERRUPTED, texts.EXPIRED_CARD
                    )
                ],
            )
        )
    if waiting.card is None:
        return []
    return [answered(waiting.card.settled(CardStatus.EXPIRED), state, waiting.message)]


def answered(card: Card, state: AgentState, message: Msg) -> MessageUpdate:
    """The card's record, settled: only if it still awaits confirmation, so two
    answers cannot both land. Its blocks are written again, so that each call on it
    shows its outcome (`message` holds the card; its calls' results are in `state`)."""
    blocks = outcomes.card_turn_blocks(state.context, message)
    return MessageUpdate(
        message_id=card.record_id,
        status=MessageStatus.NORMAL,
        blocks=outcomes.record_blocks(blocks, outcomes.results_of(state.context)),
        metadata={"card": card.to_json()},
        expected_status=MessageStatus.AWAITING_CONFIRM,
    )


def decision_message(waiting: WaitingCalls, approved: bool) -> Msg:
    """How a confirmation reaches the runtime: a user message with no text whose
    metadata carries the decisions. It never enters the model context."""
    return Msg(
        role=Role.USER,
        name="user",
        content=[],
        metadata={
            CONFIRM_RESULTS_KEY: [
                {"call_id": call.id, "approved": approved} for call in waiting.calls
            ]
        },
    )


def approvals(decision: Msg) -> dict[str, bool]:
    return {
        item["call_id"]: bool(item["approved"])
        for item in decision.metadata.get(CONFIRM_RESULTS_KEY, [])
    }


def denied(call: ToolUseBlock) -> ToolResultBlock:
    """The framework's stored answer to a declined call (the middleware rewrites what
    the model reads; see middleware.py)."""
    return ToolResultBlock.of_text(
        call.id, call.name, ToolResultState.DENIED, PERMISSION_DENIED_TEXT
    )
