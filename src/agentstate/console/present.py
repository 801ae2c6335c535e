"""Message records and turn events in words a user understands (never internal names).

The agent's records carry each tool call as blocks (`tool_use`, `tool_result`); newer
agents add to a record's `tool_use` its final `outcome` and a short `outcome_text`. The
status word is always the console's own (one language for the interface, live and on
replay): from the outcome, else derived from the blocks, the card and the record's status;
the agent's `outcome_text` (in its profile's language) is shown beside it as a detail.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from agentstate.agent.v1 import agent_service_pb2 as pb

ROLES = {pb.MESSAGE_ROLE_USER: "user", pb.MESSAGE_ROLE_ASSISTANT: "assistant"}

RECORD_WORDS = {
    pb.MESSAGE_STATUS_NORMAL: "",
    pb.MESSAGE_STATUS_AWAITING_CONFIRM: "Waiting for your decision on the card",
    pb.MESSAGE_STATUS_INTERRUPTED: "Stopped before it finished",
    pb.MESSAGE_STATUS_ERROR: "Something went wrong in this turn",
    pb.MESSAGE_STATUS_STREAMING: "Still being written…",
}

OUTCOME_WORDS = {
    "finished": "Done",
    "failed": "Failed",
    "declined": "Declined by you: not run",
    "expired": "The card expired: not run",
    "interrupted": "Not run: the turn was stopped",
}

_RESULT_WORDS = {
    "success": "Done",
    "error": "Failed",
    "denied": "Declined by you: not run",
    "interrupted": "Not run",
    "running": "Running…",
}

CARD_WORDS = {
    "pending": "Waiting for your decision",
    "approved": "Approved by you",
    "denied": "Declined by you: nothing was done",
    "expired": "Expired: nothing was done",
}

EVENT_WORDS = {
    pb.TOOL_CALL_STATUS_RUNNING: "Running…",
    pb.TOOL_CALL_STATUS_SUCCEEDED: "Done",
    pb.TOOL_CALL_STATUS_FAILED: "Failed",
    pb.TOOL_CALL_STATUS_ASKING: "Waiting for your confirmation",
    pb.TOOL_CALL_STATUS_DENIED: "Declined by you: not run",
    pb.TOOL_CALL_STATUS_INTERRUPTED: "Not run",
}

_TEXT_KINDS = {
    pb.MESSAGE_TYPE_THINKING: "thinking",
    pb.MESSAGE_TYPE_RESPONSE: "response",
    pb.MESSAGE_TYPE_ERROR: "error",
}


def _iso(ts: Any) -> str | None:
    return ts.ToDatetime(tzinfo=UTC).isoformat() if ts.seconds or ts.nanos else None


def _loads(raw: bytes, default: Any) -> Any:
    try:
        return json.loads(raw) if raw else default
    except ValueError:
        return default


def _output_text(block: dict[str, Any]) -> str:
    output = block.get("output")
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return str(output or "")


def _first_line(text: str, limit: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def card_view(
    card: dict[str, Any], now: datetime, inputs: dict[Any, Any] | None = None
) -> dict[str, Any]:
    """A card as the page draws it; `inputs` maps call ids to the tool_use inputs of the
    card's record, so the card says what each tool will be run with."""
    inputs = inputs or {}
    status = str(card.get("status", "pending"))
    expires = str(card.get("expires_at", ""))
    try:
        lapsed = status == "pending" and datetime.fromisoformat(expires) <= now
    except ValueError:
        lapsed = False
    if lapsed:
        status = "expired"
    return {
        "message_id": str(card.get("record_id", "")),
        "title": str(card.get("title", "")),
        "expires_at": expires,
        "open": status == "pending",
        "words": CARD_WORDS.get(status, "Answered"),
        "calls": [
            {
                "title": str(c.get("title", "")),
                "tool_name": str(c.get("name", "")),
                "fields": [[str(k), str(v)] for k, v in c.get("fields", [])],
                "arguments": inputs.get(c.get("call_id"), {}),
            }
            for c in card.get("calls", [])
            if isinstance(c, dict)
        ],
    }


def tool_outputs(records: Any) -> dict[Any, dict[str, Any]]:
    """The tool_result blocks of some records by call id: a card's call is answered in the
    record of the turn that answered the card, not in the card's own record."""
    return {
        b.get("id"): b
        for r in records
        for b in _loads(r.blocks_json, [])
        if isinstance(b, dict) and b.get("type") == "tool_result"
    }


def unanswered(records: Any, outputs: dict[Any, dict[str, Any]]) -> bool:
    """Whether some tool_use of these records has no result among `outputs`."""
    return any(
        isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") not in outputs
        for r in records
        for b in _loads(r.blocks_json, [])
    )


def record_view(
    record: Any, now: datetime | None = None, others: dict[Any, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """One agent MessageRecord as the page draws it; `others` are tool results found in
    the records around it (tool_outputs)."""
    now = now or datetime.now(UTC)
    blocks = [b for b in _loads(record.blocks_json, []) if isinstance(b, dict)]
    metadata = _loads(record.metadata_json, {})
    card = metadata.get("card") if isinstance(metadata, dict) else None
    card_status = str(card.get("status", "")) if isinstance(card, dict) else ""
    results = {
        **(others or {}),
        **{b.get("id"): b for b in blocks if b.get("type") == "tool_result"},
    }
    inputs = {b.get("id"): b.get("input", {}) for b in blocks if b.get("type") == "tool_use"}
    items: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            items.append({"kind": "text", "text": str(block["text"])})
        elif kind == "thinking" and block.get("thinking"):
            items.append({"kind": "thinking", "text": str(block["thinking"])})
        elif kind == "tool_use":
            result = results.get(block.get("id"))
            items.append(
                {
                    "kind": "tool",
                    "call_id": str(block.get("id", "")),
                    "tool_name": str(block.get("name", "")),
                    "arguments": block.get("input", {}),
                    "words": _tool_words(block, result, record, card_status),
                    # The agent's own sentence (in its profile's language) is a detail
                    # under the console's status word, never instead of it.
                    "detail": str(block.get("outcome_text", "")),
                    "output": _output_text(result) if result is not None else "",
                }
            )
    # An ERROR record keeps the failure's sentence in metadata {"error": …}; its blocks
    # are what was streamed before the failure, shown as a partial answer.
    failed = record.status == pb.MESSAGE_STATUS_ERROR
    error_text = ""
    if failed and isinstance(metadata, dict) and isinstance(metadata.get("error"), str):
        error_text = metadata["error"]
    return {
        "message_id": record.message_id,
        "role": ROLES.get(record.role, "assistant"),
        "status_words": RECORD_WORDS.get(record.status, ""),
        "streaming": record.status == pb.MESSAGE_STATUS_STREAMING,
        "error": failed,
        "error_text": error_text,
        "partial": failed and any(i["kind"] == "text" for i in items),
        "items": items,
        "card": card_view(card, now, inputs) if isinstance(card, dict) else None,
        "create_time": _iso(record.create_time),
        "update_time": _iso(record.update_time),
        # The turn's timeline the agent saved on its reply record (runtime/timeline.py).
        "timeline": metadata.get("timeline")
        if isinstance(metadata, dict) and isinstance(metadata.get("timeline"), dict)
        else None,
    }


def _tool_words(
    use: dict[str, Any], result: dict[str, Any] | None, record: Any, card_status: str
) -> str:
    if use.get("outcome") in OUTCOME_WORDS:
        return OUTCOME_WORDS[str(use["outcome"])]
    if result is not None:
        words = _RESULT_WORDS.get(str(result.get("state", "")), "Finished")
        if result.get("state") == "error" and _output_text(result):
            words += f": {_output_text(result).splitlines()[0]}"
        return words
    if card_status in ("denied", "expired", "approved"):
        return {"denied": "Declined by you: not run", "expired": "The card expired: not run"}.get(
            card_status, "Approved by you"
        )
    if record.status == pb.MESSAGE_STATUS_AWAITING_CONFIRM:
        return "Waiting for your confirmation"
    if record.status == pb.MESSAGE_STATUS_STREAMING:
        return "Running…"
    if record.status == pb.MESSAGE_STATUS_INTERRUPTED:
        return "Not run: the turn was stopped"
    return "Done"


_LIVE_CALL_WORDS = {
    "running": "Running…",
    "succeeded": "Done",
    "failed": "Failed",
    "asking": "Waiting for your confirmation",
    "denied": "Declined by you: not run",
    "interrupted": "Not run",
}


def live_event_view(data: Any) -> dict[str, Any] | None:
    """One event of a running turn's journal (the agent's `live` record metadata) as the
    page's stream event; None for one it does not know."""
    if not isinstance(data, dict):
        return None
    kind = data.get("type")
    if kind == "message":
        return {"type": "message", "kind": str(data.get("kind")), "delta": str(data.get("delta"))}
    if kind == "block":
        return {
            "type": "block",
            "call_id": str(data.get("call_id", "")),
            "tool_name": str(data.get("tool_name", "")),
            "words": _LIVE_CALL_WORDS.get(str(data.get("status")), ""),
            "arguments": data.get("arguments") or {},
            "summary": _first_line(str(data.get("summary") or "")),
        }
    if kind == "hint":
        return {"type": "hint", "text": str(data.get("text", ""))}
    if kind == "progress":
        return {
            "type": "progress",
            "attempt": int(data.get("attempt") or 1),
            "attempts": int(data.get("attempts") or 1),
            "elapsed_ms": int(data.get("elapsed_ms") or 0),
            "note": str(data.get("note") or ""),
        }
    return None


def event_view(event: Any) -> dict[str, Any]:
    """One TurnEvent as a JSON object for the page's stream."""
    kind = event.WhichOneof("event")
    if kind == "meta":
        m = event.meta
        return {
            "type": "meta",
            "conversation_id": m.conversation_id,
            "task_id": m.task_id,
            "new_conversation": m.new_conversation,
        }
    if kind == "message":
        return {
            "type": "message",
            "kind": _TEXT_KINDS.get(event.message.type, "response"),
            "delta": event.message.delta,
        }
    if kind == "block":
        b = event.block
        return {
            "type": "block",
            "call_id": b.call_id,
            "tool_name": b.tool_name,
            "words": EVENT_WORDS.get(b.status, ""),
            "arguments": _loads(b.arguments_json, {}),
            "summary": _first_line(b.summary),
        }
    if kind == "hint":
        return {"type": "hint", "text": event.hint.text}
    if kind == "progress":
        p = event.progress
        return {
            "type": "progress",
            "attempt": p.attempt,
            "attempts": p.attempts,
            "elapsed_ms": p.elapsed_ms,
            "note": p.note,
        }
    if kind == "finish":
        return {"type": "finish", "message_id": event.finish.message_id}
    if kind == "confirm":
        c = event.confirm
        return {
            "type": "confirm",
            "card": {
                "message_id": c.message_id,
                "title": c.title,
                "expires_at": _iso(c.expire_time),
                "open": True,
                "words": CARD_WORDS["pending"],
                "calls": [
                    {
                        "title": call.title,
                        "tool_name": call.tool_name,
                        "fields": [[f.label, f.value] for f in call.display_fields],
                        "arguments": _loads(call.arguments_json, {}),
                    }
                    for call in c.calls
                ],
            },
        }
    if kind == "cancel":
        return {
            "type": "cancel",
            "message_id": event.cancel.message_id,
            "reason": event.cancel.reason,
        }
    return {"type": "done"}
