"""RAG-mode history: rebuilt from the message records, not from the agent state.

The recent turns a retrieval-augmented answer needs: user and assistant text
only (thinking and tool blocks dropped), empty messages skipped, citation
markers such as [^1], [1] or 【1】 stripped from assistant text, and never
starting with an assistant message. Records still streaming or failed are not
history yet and are skipped, and so is the question they were answering when
nothing of its turn was kept: asked again, it would otherwise appear twice in a row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_TURNS = 8
MAX_TURNS = 50
_CITATION = re.compile(r"\[\^\d+\]|\[\d+\]|【\d+】")


@dataclass(frozen=True)
class HistoryRecord:
    role: str  # "user" or "assistant"
    blocks_json: bytes
    complete: bool = True  # False for records still streaming or failed


@dataclass(frozen=True)
class HistoryMessage:
    role: str
    text: str


def _text_of(blocks_json: bytes) -> str:
    try:
        blocks = json.loads(blocks_json or b"[]")
    except ValueError:
        return ""
    return "".join(
        str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text"
    )


def strip_citations(text: str) -> str:
    return re.sub(r"[ \t]{2,}", " ", _CITATION.sub("", text)).strip()


def rag_history(
    records: Iterable[HistoryRecord], turns: int = DEFAULT_TURNS
) -> list[HistoryMessage]:
    """`records` oldest first; returns the last `turns` turns, oldest first."""
    messages: list[HistoryMessage] = []
    for record in records:
        if not record.complete:
            if record.role == "assistant" and messages and messages[-1].role == "user":
                messages.pop()  # a question whose answer failed was not answered
            continue
        if record.role not in ("user", "assistant"):
            continue
        text = _text_of(record.blocks_json)
        text = strip_citations(text) if record.role == "assistant" else text.strip()
        if text:
            messages.append(HistoryMessage(record.role, text))
    starts = [i for i, m in enumerate(messages) if m.role == "user"]
    if not starts or turns <= 0:
        return []
    # Keep the last `turns` turns; history never starts with an assistant message.
    return messages[starts[max(0, len(starts) - turns)] :]
