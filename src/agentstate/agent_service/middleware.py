"""Middlewares run on the copy of the context about to be sent to the model.

They never touch the stored state: the runtime hands them a new list of the same
messages, and a middleware that changes a message puts a changed copy of it in
its place (copy on write: nothing is copied for the messages it leaves alone).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from agentstate.agent_service.agent_state import (
    PERMISSION_DENIED_TEXT,
    Block,
    Msg,
    ToolResultBlock,
    ToolResultState,
)

ContextMiddleware = Callable[[list[Msg]], list[Msg]]

# The source's AgentConfirmDenialMiddleware wording: what happened, what it is
# not, and what to do next.
DENIAL_REWRITE_TEXT = (
    "用户在确认卡片上点了取消，这次操作没有执行。这不是权限不足，也不是系统故障。"
    "请如实告诉用户操作已取消；等用户确认后再重新发起。"
)


def rewrite_denials(context: list[Msg]) -> list[Msg]:
    """Replace the framework's "Permission denied by user" with what really happened.

    Left as it is, a model reads it as missing permissions and may tell the user
    they lack rights or suggest fixing them; the user simply chose not to run it.
    """
    rewritten = []
    for msg in context:
        if any(_is_raw_denial(block) for block in msg.content):
            content: list[Block] = [
                ToolResultBlock.of_text(block.id, block.name, block.state, DENIAL_REWRITE_TEXT)
                if isinstance(block, ToolResultBlock) and _is_raw_denial(block)
                else block
                for block in msg.content
            ]
            msg = msgspec.structs.replace(msg, content=content)
        rewritten.append(msg)
    return rewritten


def _is_raw_denial(block: Block) -> bool:
    return (
        isinstance(block, ToolResultBlock)
        and block.state is ToolResultState.DENIED
        and block.text.strip() == PERMISSION_DENIED_TEXT
    )


DEFAULT_MIDDLEWARES: tuple[ContextMiddleware, ...] = (rewrite_denials,)
