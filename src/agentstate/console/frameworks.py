"""Sessions that agent frameworks keep in the state service, read for the console:
LangGraph threads (checkpoint history, pending writes, channel values, an interrupt
shown as a waiting card), OpenAI Agents SDK sessions (their items) and Google ADK
sessions (their events, and their state by scope). Read-only, through the public client
(agentstate.client), by the conventions of the adapters in agentstate.integrations: an
ADK session is the conversation keyed "adk:<app>:<session>", an OpenAI Agents session
"openai:<session>", a LangGraph thread the conversation keyed by its thread id that has
checkpoints. Nothing here imports a framework; LangGraph's serializer decodes channel
values when it is installed, else they show as their type and size.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from agentstate.client import AsyncStateClient

ADK_PREFIX, OPENAI_PREFIX = "adk:", "openai:"
ADK_SESSION_STATE_KEY = "adk.session"
INTERRUPT_CHANNEL = "__interrupt__"
MAX_CHECKPOINTS = 50
MAX_VALUE_CHARS = 4000


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A decoded framework value as JSON a page can show (objects by their fields)."""
    if depth > 8:
        return repr(value)[:200]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v, depth + 1) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return {"type": type(value).__name__, **_jsonable(dump(), depth + 1)}
        except Exception:  # a model that will not dump: shown by its repr
            return repr(value)[:MAX_VALUE_CHARS]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"type": type(value).__name__, **_jsonable(fields, depth + 1)}
    return repr(value)[:MAX_VALUE_CHARS]


def _loads_json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return f"<{len(raw)} bytes, not JSON>"


class _Decoder:
    """LangGraph's serializer when it is installed (values then read as the graph wrote
    them), else each value as its type and size."""

    def __init__(self) -> None:
        try:
            from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
        except ImportError:
            self._serde: Any = None
        else:
            self._serde = JsonPlusSerializer()

    def __call__(self, value_type: str, value: bytes) -> Any:
        if value_type == "json":
            return _loads_json(value)
        if self._serde is None or value_type in ("", "empty"):
            return f"<{value_type or 'empty'}: {len(value)} bytes>"
        try:
            return _jsonable(self._serde.loads_typed((value_type, value)))
        except Exception as exc:  # a value this console cannot decode: say so, go on
            return f"<{value_type}: {len(value)} bytes, not decoded: {type(exc).__name__}>"


_decode = _Decoder()


async def framework_session(
    client: AsyncStateClient, user_id: str, conversation_id: str
) -> dict[str, Any]:
    """What a framework keeps in this conversation; {"kind": "agentstate"} for one of
    the agent service's own (or one no framework wrote)."""
    conversation = await client.get_conversation(user_id, conversation_id)
    key = conversation.external_key
    if key.startswith(ADK_PREFIX):
        return await _adk(client, user_id, conversation_id, key)
    if key.startswith(OPENAI_PREFIX):
        return {
            "kind": "openai-agents",
            "session_id": key.removeprefix(OPENAI_PREFIX),
            "items": await _items(client, user_id, conversation_id),
        }
    page = await client.list_checkpoints(user_id, conversation_id, page_size=MAX_CHECKPOINTS)
    if page.items:
        return _langgraph(key, page.items, bool(page.next_page_token))
    return {"kind": "agentstate"}


async def _items(client: AsyncStateClient, user_id: str, conversation_id: str) -> list[Any]:
    page = await client.list_items(user_id, conversation_id, page_size=1000)
    return [
        {
            "seq": item.seq,
            "time": item.item_time.isoformat(),
            "item": _loads_json(item.item_json),
        }
        for item in page.items
    ]


async def _adk(
    client: AsyncStateClient, user_id: str, conversation_id: str, key: str
) -> dict[str, Any]:
    app, _, session_id = key.removeprefix(ADK_PREFIX).partition(":")
    stored = await client.find_state(user_id, conversation_id, state_key=ADK_SESSION_STATE_KEY)
    scoped = await client.get_scoped_state(user_id, app)
    return {
        "kind": "adk",
        "app_name": app,
        "session_id": session_id,
        "events": await _items(client, user_id, conversation_id),
        "state": {
            "session": _loads_json(stored.payload) if stored is not None else {},
            "user": _loads_json(scoped.user.payload) if scoped.user is not None else {},
            "app": _loads_json(scoped.app.payload) if scoped.app is not None else {},
        },
    }


def _langgraph(thread_id: str, checkpoints: list[Any], more: bool) -> dict[str, Any]:
    history = []
    waiting: list[Any] = []
    for index, c in enumerate(checkpoints):  # newest first
        writes = [
            {
                "task_id": w.task_id,
                "task_path": w.task_path,
                "channel": w.channel,
                "value": _decode(w.value_type, w.value),
            }
            for w in c.pending_writes
        ]
        if index == 0:
            # The newest checkpoint's interrupt: the graph waits for a human (a card).
            waiting = [w["value"] for w in writes if w["channel"] == INTERRUPT_CHANNEL]
        history.append(
            {
                "checkpoint_id": c.checkpoint_id,
                "parent_checkpoint_id": c.parent_checkpoint_id,
                "namespace": c.namespace,
                "create_time": c.create_time.isoformat(),
                "metadata": _loads_json(c.metadata_json),
                "channel_values": {
                    v.channel: _decode(v.value_type, v.value) for v in c.channel_values
                },
                "pending_writes": writes,
            }
        )
    return {
        "kind": "langgraph",
        "thread_id": thread_id,
        "checkpoints": history,
        "more_checkpoints": more,
        "waiting": waiting,
    }
