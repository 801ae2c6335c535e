"""Middlewares run on the copy of the context about to be sent to the model.

They never touch the stored state: the runtime hands them a deep copy.
"""

from __future__ import annotations

from collections.abc import Callable

from agent_service.agent_state import (
    PERMISSION_DENIED_TEXT,
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
    for msg in context:
        for index, block in enumerate(msg.content):
            if (
                isinstance(block, ToolResultBlock)
                and block.state is ToolResultState.DENIED
                and block.text.strip() == PERMISSION_DENIED_TEXT
            ):
                msg.content[index] = ToolResultBlock.of_text(
                    block.id, block.name, block.state, DENIAL_REWRITE_TEXT
                )
    return context


DEFAULT_MIDDLEWARES: tuple[ContextMiddleware, ...] = (rewrite_denials,)
