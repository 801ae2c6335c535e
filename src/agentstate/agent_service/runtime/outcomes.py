"""What the message records say about each tool call: its final outcome, for a page.

The records are what a page replays, so a record's `tool_use` block carries, once
the call is settled, `outcome` (finished, failed, declined, expired, interrupted)
and `outcome_text`, a sentence the page can show; while it runs or waits on a card
the block has neither. A declined call's `tool_result` shows the user's words, not
the framework's "Permission denied by user", which only the AgentState keeps (the
source's exact text; middleware.py rewrites what the model reads).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentstate.agent_service.agent_state import (
    Block,
    Msg,
    Role,
    ToolResultBlock,
    ToolResultState,
    ToolUseBlock,
)
from agentstate.agent_service.runtime import texts

JSON = dict[str, Any]

CARD_METADATA_KEY = "confirm"  # as in cards.py (which imports this module)


class CallOutcome(enum.StrEnum):
    FINISHED = "finished"
    FAILED = "failed"
    DECLINED = "declined"
    EXPIRED = "expired"
    INTERRUPTED = "interrupted"


OUTCOME_TEXTS = {
    CallOutcome.FINISHED: texts.OUTCOME_FINISHED,
    CallOutcome.FAILED: texts.OUTCOME_FAILED,
    CallOutcome.DECLINED: texts.OUTCOME_DECLINED,
    CallOutcome.EXPIRED: texts.OUTCOME_EXPIRED,
    CallOutcome.INTERRUPTED: texts.OUTCOME_INTERRUPTED,
}


def outcome_of(result: ToolResultBlock) -> CallOutcome | None:
    """The outcome a call's result settles it with; None while it still runs."""
    if result.state is ToolResultState.SUCCESS:
        return CallOutcome.FINISHED
    if result.state is ToolResultState.ERROR:
        return CallOutcome.FAILED
    if result.state is ToolResultState.DENIED:
        return CallOutcome.DECLINED
    if result.state is ToolResultState.INTERRUPTED:
        # An expired card's calls are answered "interrupted" with our expiry text.
        return CallOutcome.EXPIRED if result.text == texts.EXPIRED_CARD else CallOutcome.INTERRUPTED
    return None


def results_of(messages: Iterable[Msg]) -> dict[str, ToolResultBlock]:
    return {
        block.id: block
        for msg in messages
        if msg.role is Role.TOOL
        for block in msg.content
        if isinstance(block, ToolResultBlock)
    }


def record_block(block: Block, results: Mapping[str, ToolResultBlock]) -> JSON:
    """One state block as a message record shows it."""
    data = block.to_json()
    if isinstance(block, ToolUseBlock):
        result = results.get(block.id)
        outcome = outcome_of(result) if result is not None else None
        if outcome is not None:
            data["outcome"] = outcome.value
            data["outcome_text"] = OUTCOME_TEXTS[outcome]
    elif isinstance(block, ToolResultBlock) and block.state is ToolResultState.DENIED:
        data["output"] = [{"type": "text", "text": texts.OUTCOME_DECLINED}]
    return data


def record_blocks(blocks: Iterable[Block], results: Mapping[str, ToolResultBlock]) -> list[JSON]:
    return [record_block(block, results) for block in blocks]


def card_turn_blocks(context: Sequence[Msg], card_message: Msg) -> list[Block]:
    """The blocks of the record that showed a card, rebuilt from the state: the
    messages of the card's turn, after its question (or after the card a Confirm
    answered), up to the message holding the card. The runtime writes a record's
    blocks from exactly these messages, and nothing trims or compacts them while
    the card is open (docs/context.md)."""
    end = next((i for i, m in enumerate(context) if m is card_message), None)
    if end is None:
        return list(card_message.content)
    start = end
    while start > 0:
        previous = context[start - 1]
        if previous.role is Role.USER and previous.text.strip():
            break  # the question of the card's turn
        if previous.role is Role.ASSISTANT and CARD_METADATA_KEY in previous.metadata:
            break  # the card a Confirm answered before this one was shown
        start -= 1
    return [block for msg in context[start : end + 1] for block in msg.content]
