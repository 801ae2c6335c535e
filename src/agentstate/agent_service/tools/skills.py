"""load_skill: a profile's handbooks, which the model loads on demand."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import Any

from agentstate.agent_service.agent_state import Msg, ToolResultBlock, ToolResultState, ToolUseBlock
from agentstate.agent_service.model.base import ToolSpec
from agentstate.agent_service.tools.registry import Tool, ToolContext, ToolOutput


def read_skills(package: str) -> dict[str, str]:
    """Handbooks shipped as Markdown files in a package: name (file stem) -> text."""
    skills: dict[str, str] = {}
    for entry in resources.files(package).iterdir():
        if entry.name.endswith(".md"):
            skills[entry.name.removesuffix(".md")] = entry.read_text(encoding="utf-8")
    return skills


def load_skill_tool(skills: Mapping[str, str]) -> Tool:
    handbooks = dict(skills)
    names = ", ".join(sorted(handbooks))

    async def run(args: dict[str, Any], context: ToolContext) -> ToolOutput:
        name = str(args["name"])
        text = handbooks.get(name)
        if text is None:
            return ToolOutput(f"没有名为 {name!r} 的手册。可用的手册：{names}", ok=False)
        return ToolOutput(text)

    return Tool(
        spec=ToolSpec(
            name="load_skill",
            description=f"加载一本业务处理手册，按手册的步骤办事。可用的手册：{names}",
            parameters={
                "type": "object",
                "properties": {"name": {"type": "string", "description": "手册名"}},
                "required": ["name"],
                "additionalProperties": False,
            },
        ),
        run=run,
    )


def active_skills(context: list[Msg]) -> set[str]:
    """Skills whose handbook is in the context now: a successful load_skill result."""
    requested = {
        block.id: str(block.input.get("name", ""))
        for msg in context
        for block in msg.content
        if isinstance(block, ToolUseBlock) and block.name == "load_skill"
    }
    return {
        requested[block.id]
        for msg in context
        for block in msg.content
        if isinstance(block, ToolResultBlock)
        and block.name == "load_skill"
        and block.state is ToolResultState.SUCCESS
        and block.id in requested
    }
