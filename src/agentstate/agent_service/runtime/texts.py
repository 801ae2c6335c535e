"""Every word the runtime says, in one place.

What the end user reads (hints, replies the runtime writes itself, what a tool
result says when a call could not run) is Chinese, like the product; what a
calling service reads in an error status is English.
"""

from __future__ import annotations

# ------------------------------------------------------------- to the end user

EXPIRED_CARD = "确认卡片已过期，操作没有执行。"
TOO_MANY_STEPS = "这个问题需要的步骤太多，我先停在这里。"
MULTI_CALL_CARD_TITLE = "{count} 个操作需要确认"

HINT_RESUMED_AFTER_SHUTDOWN = "上一轮因服务停机被中断，已从保存的状态继续。"
HINT_DEAD_TURN_REPAIRED = "上一轮没有正常结束（服务异常退出），它未完成的回复已标记为中断。"
HINT_EXPIRED_CARD_SETTLED = "上一张确认卡片已过期，其中的操作没有执行。"
HINT_COMPACTED = "早前的对话已压缩成摘要，完整记录仍可在历史里查看。"

# What an ERROR record shows (its metadata "error"), and the turn's ERROR event.
CARD_HANDLED_RECORD = "这张确认卡片已经处理过了。"
SAVE_FAILED_RECORD = "这一轮的结果没有保存成功，请重试。"
STATE_TOO_LARGE_RECORD = "这个会话的内容太多，这一轮的结果没有保存，请开始一个新的会话。"
MODEL_FAILED_TIMEOUT = "模型响应超时，这一轮没有完成，请稍后重试。"
MODEL_FAILED_UNREACHABLE = "暂时连不上模型服务，这一轮没有完成，请稍后重试。"
MODEL_FAILED_BUSY = "模型服务繁忙或额度已用完，这一轮没有完成，请稍后重试。"
MODEL_FAILED_CONFIG = "模型服务的配置有问题，这一轮没有完成，请联系管理员。"
MODEL_FAILED_BAD_REPLY = "模型返回的内容无法识别，这一轮没有完成，请重试。"
MODEL_FAILED_OTHER = "模型服务出错，这一轮没有完成，请稍后重试。"

# A tool call's final outcome, as a message record shows it (runtime/outcomes.py).
OUTCOME_FINISHED = "已执行完成。"
OUTCOME_FAILED = "执行出错，没有完成。"
OUTCOME_DECLINED = "你在确认卡片上点了取消，操作没有执行。"
OUTCOME_EXPIRED = "确认卡片已过期，操作没有执行。"
OUTCOME_INTERRUPTED = "操作被中断，没有执行完。"

# Tool results the model reads when a call could not run.
NO_SUCH_TOOL = "没有名为 {name} 的工具。"
TOOL_NEEDS_SKILL = "工具 {name} 现在不可用：先用 load_skill 加载手册 {skill}。"
BAD_ARGUMENTS = "参数错误：{error}"
TOOL_FAILED = "工具出错：{error}"

# ------------------------------------------------------------- to the caller

QUESTION_EMPTY = "question must not be empty"
QUESTION_TOO_LONG = "question is longer than {limit} characters"
QUESTION_HAS_NUL = "question must not contain NUL characters"
MESSAGE_ID_REQUIRED = "message_id is required"
CONVERSATION_ID_REQUIRED = "conversation_id is required"
DRAINING = "this agent replica is shutting down; retry on another"
CARD_PENDING = (
    "confirmation card {message_id} is still pending: "
    "answer it with Confirm before asking something new"
)
CARD_ALREADY_HANDLED = "confirmation card {message_id} was already handled"
NOT_A_CARD = "message {message_id} is not a confirmation card; Confirm answers only cards"
BAD_ID = "{what} {value!r} is not a valid id"
CARD_EXPIRED = (
    "confirmation card {message_id} expired at {expires_at}; its operations were not executed"
)
MODEL_FAILED = "the model failed: {error}"

# Why a turn was cancelled (the cancel event's reason).
STOPPED_BY_USER = "stopped by the user"
LEASE_LOST = "the run lease was lost"
SHUTTING_DOWN = "the service is shutting down"
INTERRUPTED = "interrupted"
