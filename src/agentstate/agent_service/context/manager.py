"""Keeping the agent's context inside its token budget.

Stage 1, trimming (above `trim_at` of the budget): the text of older tool
results is replaced by a placeholder that keeps the call id, tool name, state,
original length and the call's arguments. The message count does not change.
Never trimmed: the current turn, an unfinished tool cycle, and the last
`keep_cycles` finished cycles.

Stage 2, compaction (above `compact_at`): the earliest part of the context,
cut only where a user turn starts, is replaced by a summary written by the
model. The summary lives in AgentState.summary; the model receives it with the
system prompt (see docs/context.md), and the context list starts at the first
kept user turn. A tool_use is never separated from its
tool_result, a pending (asking) call is never compacted away, and when no safe
cut exists nothing is compacted.

Last resort, only for a single tool result bigger than the budget by itself:
its text is cut to fit, keeping its head and saying how long it was.

All of this changes the agent state only; message records keep the originals.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentstate.agent_service.agent_state import (
    AgentState,
    Msg,
    Role,
    ToolResultBlock,
    ToolUseBlock,
)
from agentstate.agent_service.context.tokens import TokenCounter, message_tokens, request_tokens
from agentstate.agent_service.errors import LimitReached
from agentstate.agent_service.model.base import ToolSpec

TRIM_MARKER = "[trimmed tool result]"
# Messages whose token counts a ContextManager keeps (all conversations together).
TOKEN_CACHE_ENTRIES = 50_000
TRUNCATION_MARKER = "[truncated: this tool result alone exceeded the context budget]"

# (previous summary, messages it replaces, token allowance) -> new summary
Summarize = Callable[[str, Sequence[Msg], int], Awaitable[str]]


@dataclass(frozen=True)
class ContextSettings:
    budget_tokens: int = 32_000
    trim_at: float = 0.5
    compact_at: float = 0.8
    # After a compaction the context should fall to about this share of the budget.
    compact_to: float = 0.4
    # The summary may take at most this share of the budget.
    summary_share: float = 0.15
    keep_cycles: int = 3
    max_state_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True)
class CompactionDone:
    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    summary_chars: int
    reason: str


@dataclass
class ContextReport:
    """What one preparation did, for events, records and metrics."""

    tokens: int = 0
    trimmed: int = 0
    trim_seconds: float = 0.0
    compactions: list[CompactionDone] = field(default_factory=list)
    compact_seconds: float = 0.0


def is_trimmed(block: ToolResultBlock) -> bool:
    return block.text.startswith((TRIM_MARKER, TRUNCATION_MARKER))


def current_turn_start(context: Sequence[Msg]) -> int:
    """Index of the last user message with text: where the current turn begins."""
    for index in range(len(context) - 1, -1, -1):
        if context[index].role is Role.USER and context[index].text:
            return index
    return 0


def _turn_starts(context: Sequence[Msg]) -> list[int]:
    return [i for i, m in enumerate(context) if m.role is Role.USER and m.text]


def _first_pending_index(state: AgentState) -> int | None:
    pending_ids = {call.id for _, call in state.pending_calls()}
    for index, msg in enumerate(state.context):
        if any(isinstance(b, ToolUseBlock) and b.id in pending_ids for b in msg.content):
            return index
    return None


def _cut_is_safe(context: Sequence[Msg], cut: int) -> bool:
    """No call before the cut has its result after it (or the other way round)."""
    before_uses = {b.id for m in context[:cut] for b in m.content if isinstance(b, ToolUseBlock)}
    before_results = {
        b.id for m in context[:cut] for b in m.content if isinstance(b, ToolResultBlock)
    }
    return before_uses == before_results


class ContextManager:
    def __init__(
        self,
        settings: ContextSettings,
        counter: TokenCounter,
        summarize: Summarize,
        system_prompt: str,
    ) -> None:
        self.settings = settings
        self.counter = counter
        self.summarize = summarize
        self.system_prompt = system_prompt
        self._token_cache: dict[int, tuple[Msg, list[Any], int]] = {}

    def measure(self, state: AgentState, tools: Sequence[ToolSpec] = ()) -> int:
        fixed = request_tokens(self.counter, self.system_prompt, state.summary, (), tools)
        return fixed + sum(map(self.message_tokens, state.context))

    def message_tokens(self, msg: Msg) -> int:
        """A message's tokens, counted once per message: a model step then costs the
        same at 8 and at 512 messages. The entry holds the message (so its id is not
        reused) and its content list; trimming and truncation, the only changes made to
        a message already in the context, forget it (`_forget`)."""
        entry = self._token_cache.get(id(msg))
        if entry is not None and entry[0] is msg and entry[1] is msg.content:
            return entry[2]
        tokens = message_tokens(self.counter, msg)
        if len(self._token_cache) >= TOKEN_CACHE_ENTRIES:
            self._token_cache.clear()  # bounded: contexts come and go between turns
        self._token_cache[id(msg)] = (msg, msg.content, tokens)
        return tokens

    def _forget(self, msg: Msg) -> None:
        self._token_cache.pop(id(msg), None)

    async def prepare(self, state: AgentState, tools: Sequence[ToolSpec] = ()) -> ContextReport:
        """Trim, then compact, as the budget requires. Changes `state` in place."""
        budget = self.settings.budget_tokens
        report = ContextReport(tokens=self.measure(state, tools))
        if report.tokens > self.settings.trim_at * budget:
            started = time.perf_counter()
            report.trimmed = self.trim(state, keep_cycles=self.settings.keep_cycles)
            report.trim_seconds = time.perf_counter() - started
            report.tokens = self.measure(state, tools)
        if report.tokens > self.settings.compact_at * budget:
            started = time.perf_counter()
            done = await self.compact(state, tools, report.tokens)
            report.compact_seconds = time.perf_counter() - started
            if done is not None:
                report.compactions.append(done)
                report.tokens = done.tokens_after
        if report.tokens > budget:
            report.trimmed += self.truncate_oversized(state, tools)
            report.tokens = self.measure(state, tools)
        return report

    # --------------------------------------------------------------- trimming

    def _protected_results(self, state: AgentState, keep_cycles: int) -> set[str]:
        context = state.context
        turn = current_turn_start(context)
        protected = {
            b.id for m in context[turn:] for b in m.content if isinstance(b, ToolResultBlock)
        }
        finished = [
            b.id for m in context[:turn] for b in m.content if isinstance(b, ToolResultBlock)
        ]
        if keep_cycles > 0:
            protected.update(finished[-keep_cycles:])
        return protected

    def trim(self, state: AgentState, *, keep_cycles: int) -> int:
        """Replace older tool results' text by placeholders; return how many."""
        protected = self._protected_results(state, keep_cycles)
        arguments = {
            b.id: b.input for m in state.context for b in m.content if isinstance(b, ToolUseBlock)
        }
        trimmed = 0
        for msg in state.context:
            for index, block in enumerate(msg.content):
                if (
                    not isinstance(block, ToolResultBlock)
                    or block.id in protected
                    or is_trimmed(block)
                ):
                    continue
                original = block.text
                placeholder = (
                    f"{TRIM_MARKER} call_id={block.id} tool={block.name} state={block.state.value} "
                    f"original_length={len(original)} chars; arguments="
                    f"{json.dumps(arguments.get(block.id, {}), ensure_ascii=False)}. "
                    "Call the tool again if its full output is needed."
                )
                msg.content[index] = ToolResultBlock.of_text(
                    block.id, block.name, block.state, placeholder
                )
                self._forget(msg)
                trimmed += 1
        return trimmed

    def truncate_oversized(self, state: AgentState, tools: Sequence[ToolSpec]) -> int:
        """Cut the text of results too big for the budget on their own; return how many."""
        limit = int(self.settings.budget_tokens * self.settings.compact_to)
        truncated = 0
        for msg in state.context:
            if self.message_tokens(msg) <= limit:
                continue
            for index, block in enumerate(msg.content):
                if not isinstance(block, ToolResultBlock) or block.text.startswith(
                    TRUNCATION_MARKER
                ):
                    continue
                original = block.text
                keep = max(200, len(original) * limit // max(1, self.counter.count(original)) // 2)
                text = (
                    f"{TRUNCATION_MARKER} original_length={len(original)} chars; "
                    f"first {keep} chars:\n{original[:keep]}"
                )
                msg.content[index] = ToolResultBlock.of_text(
                    block.id, block.name, block.state, text
                )
                self._forget(msg)
                truncated += 1
        return truncated

    # ------------------------------------------------------------- compaction

    def _choose_cut(self, state: AgentState, tools: Sequence[ToolSpec]) -> int | None:
        context = state.context
        turn = current_turn_start(context)
        pending = _first_pending_index(state)
        limit = turn if pending is None else min(turn, pending)
        candidates = [
            cut for cut in _turn_starts(context) if 0 < cut <= limit and _cut_is_safe(context, cut)
        ]
        if not candidates:
            return None
        target = self.settings.compact_to * self.settings.budget_tokens
        fixed = self.measure(AgentState(session_id="", user_id="", summary=state.summary), tools)
        tail_tokens = [self.message_tokens(m) for m in context]
        for cut in candidates:  # the earliest cut that gets under the target
            if fixed + sum(tail_tokens[cut:]) <= target:
                return cut
        return candidates[-1]  # otherwise compact as much as is safe

    async def compact(
        self, state: AgentState, tools: Sequence[ToolSpec], tokens_before: int
    ) -> CompactionDone | None:
        cut = self._choose_cut(state, tools)
        if cut is None:
            return None
        removed = state.context[:cut]
        before = len(state.context)
        allowance = int(self.settings.budget_tokens * self.settings.summary_share)
        state.summary = await self.summarize(state.summary, removed, allowance)
        state.context = state.context[cut:]
        tokens_after = self.measure(state, tools)
        budget = self.settings.budget_tokens
        return CompactionDone(
            messages_before=before,
            messages_after=len(state.context),
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            summary_chars=len(state.summary),
            reason=f"context at {tokens_before * 100 // budget}% of a {budget}-token budget",
        )

    # ------------------------------------------------------------- size guard

    async def fit_for_save(self, state: AgentState) -> tuple[bytes, list[CompactionDone]]:
        """The encoded state, made to fit the state service's limit, or LimitReached.

        Trims everything but the current turn, then compacts as far as is safe,
        then cuts oversized results. Returns the payload to save (encoded once).
        """
        limit = self.settings.max_state_bytes
        payload = state.encode()
        done: list[CompactionDone] = []
        if len(payload) > limit:
            self.trim(state, keep_cycles=0)
            payload = state.encode()
        if len(payload) > limit:
            compaction = await self.compact(state, (), self.measure(state))
            if compaction is not None:
                done.append(compaction)
            payload = state.encode()
        if len(payload) > limit:
            self.truncate_oversized(state, ())
            payload = state.encode()
        if len(payload) > limit:
            raise LimitReached(
                f"the conversation state is {len(payload)} bytes even after trimming and "
                f"compaction, over the {limit}-byte limit; it was not saved "
                "(the previous state is intact)"
            )
        return payload, done
