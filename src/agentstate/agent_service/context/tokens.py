"""Counting tokens of the context the runtime is about to send.

A real BPE tokenizer is used when its data ships inside an installed package
(`bpe-openai` carries the o200k_base and cl100k_base tables; nothing is
downloaded at run time). Model families without a bundled tokenizer (DeepSeek,
Qwen, the scripted model) are counted with o200k_base, which is close for
mixed Chinese/English text. If no tokenizer can be loaded, the fallback
estimate is one token per 3 bytes of UTF-8, which over-counts English
slightly and matches CJK text (3 bytes, about one token, per character).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Protocol

import msgspec

from agentstate.agent_service.agent_state import Msg
from agentstate.agent_service.model.base import ToolSpec

log = logging.getLogger(__name__)

# Per-message framing of chat formats (role, separators), as OpenAI documents it.
MESSAGE_OVERHEAD_TOKENS = 4


class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int: ...


class EstimatingCounter:
    name = "estimate(utf8_bytes/3)"

    def count(self, text: str) -> int:
        return (len(text.encode("utf-8")) + 2) // 3


class BpeCounter:
    def __init__(self, encoding_name: str) -> None:
        import bpe_openai  # ships its tables; imported lazily so the fallback stays usable

        self._encoding = bpe_openai.get_encoding(encoding_name)
        self.name = encoding_name
        self._cache: dict[str, int] = {}

    def count(self, text: str) -> int:
        cached = self._cache.get(text)
        if cached is None:
            cached = len(self._encoding.encode(text, disallowed_special=()))
            if len(self._cache) > 50_000:  # bounded: contexts churn between turns
                self._cache.clear()
            self._cache[text] = cached
        return cached


def encoding_for(model_name: str) -> str:
    """The bundled encoding closest to a model family."""
    name = model_name.lower()
    if name.startswith(("gpt-3.5", "gpt-4-", "text-embedding-3", "text-embedding-ada")) or (
        name == "gpt-4"
    ):
        return "cl100k_base"
    return "o200k_base"


def make_counter(setting: str, model_name: str) -> TokenCounter:
    """setting: "auto" (by model family), an encoding name, or "estimate"."""
    if setting == "estimate":
        return EstimatingCounter()
    encoding = encoding_for(model_name) if setting == "auto" else setting
    try:
        return BpeCounter(encoding)
    except Exception as exc:  # the package or table is missing: say so, keep working
        log.warning("tokenizer %s unavailable (%s); estimating tokens instead", encoding, exc)
        return EstimatingCounter()


def message_tokens(counter: TokenCounter, msg: Msg) -> int:
    # The blocks as compact JSON, encoded in C; the counter caches by text, so an
    # unchanged message costs an encode and a lookup per model step.
    body = _BLOCKS.encode(msg.content).decode()
    return counter.count(body) + MESSAGE_OVERHEAD_TOKENS


_BLOCKS = msgspec.json.Encoder()


def request_tokens(
    counter: TokenCounter,
    system_prompt: str,
    summary: str,
    context: Sequence[Msg],
    tools: Sequence[ToolSpec] = (),
) -> int:
    """Tokens of everything a model call would carry."""
    total = counter.count(system_prompt) + counter.count(summary) + MESSAGE_OVERHEAD_TOKENS
    for tool in tools:
        total += counter.count(
            json.dumps(
                {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
                ensure_ascii=False,
            )
        )
    return total + sum(message_tokens(counter, msg) for msg in context)
