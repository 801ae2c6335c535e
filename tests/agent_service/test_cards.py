"""Confirmation cards read back from a state: ours, another runtime's, and broken ones."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from agentstate.agent_service.agent_state import AgentState, Msg, Role, ToolUseBlock, ToolUseState
from agentstate.agent_service.runtime import cards
from agentstate.agent_service.runtime.cards import CARD_METADATA_KEY, Card, CardStatus

CARDS_LOGGER = "agentstate.agent_service.runtime.cards"


def _waiting(metadata: dict[str, object]) -> AgentState:
    """A state whose last assistant message holds one call waiting on a card."""
    call = ToolUseBlock(id="call-1", name="cancel_order", state=ToolUseState.ASKING)
    message = Msg(role=Role.ASSISTANT, content=[call], metadata=metadata)
    return AgentState(session_id="1", user_id="u", context=[message])


def _card(expires_at: datetime) -> dict[str, object]:
    return {
        "record_id": "42",
        "title": "取消订单 88235",
        "expires_at": expires_at.isoformat(),
        "status": "pending",
        "calls": [{"call_id": "call-1", "name": "cancel_order", "fields": [["订单", "88235"]]}],
    }


def test_our_card_is_read_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=CARDS_LOGGER)
    later = datetime.now(UTC) + timedelta(minutes=5)
    waiting = cards.waiting_calls(_waiting({CARD_METADATA_KEY: _card(later)}))
    assert waiting is not None and waiting.card is not None
    assert (waiting.card.record_id, waiting.card.status) == ("42", CardStatus.PENDING)
    assert waiting.card.calls[0].fields == [("订单", "88235")]
    assert waiting.is_card("42") and not waiting.expired(datetime.now(UTC))
    assert [c.id for c in waiting.calls] == ["call-1"]
    assert caplog.records == []


def test_calls_without_a_card_of_ours_count_as_expired_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another runtime's calls (no card under our key): expired, and nothing to log."""
    caplog.set_level(logging.WARNING, logger=CARDS_LOGGER)
    waiting = cards.waiting_calls(_waiting({"other_runtime": {"x": 1}}))
    assert waiting is not None and waiting.card is None
    assert waiting.expired(datetime.now(UTC)) and not waiting.is_card("42")
    assert caplog.records == []


@pytest.mark.parametrize(
    ("broken", "error"),
    [
        ({"title": "no record id"}, "KeyError"),
        ({**_card(datetime.now(UTC)), "expires_at": "tomorrow"}, "ValueError"),
        ({**_card(datetime.now(UTC)), "status": "maybe"}, "ValueError"),
        ({**_card(datetime.now(UTC)), "calls": [7]}, "TypeError"),
    ],
)
def test_a_card_of_ours_that_does_not_decode_is_logged_and_its_calls_expire(
    caplog: pytest.LogCaptureFixture, broken: dict[str, object], error: str
) -> None:
    caplog.set_level(logging.WARNING, logger=CARDS_LOGGER)
    state = _waiting({CARD_METADATA_KEY: broken})
    message = state.context[0]
    assert Card.of(message) is None
    [logged] = caplog.records
    assert logged.levelno == logging.WARNING
    assert f"the card on message {message.id} does not decode ({error}" in logged.getMessage()
    assert getattr(logged, "message_id", None) == message.id
    waiting = cards.waiting_calls(state)
    assert waiting is not None and waiting.card is None and waiting.expired(datetime.now(UTC))
