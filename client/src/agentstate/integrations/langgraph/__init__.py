"""LangGraph on the state service: `pip install 'agentstate-client[langgraph]'`.

from agentstate.integrations.langgraph import AgentStateSaver
graph = builder.compile(checkpointer=AgentStateSaver("127.0.0.1:50051"))
"""

from agentstate.integrations.langgraph.saver import (
    AgentStateSaver,
    CheckpointConflict,
    ThreadDeleted,
)

__all__ = ["AgentStateSaver", "CheckpointConflict", "ThreadDeleted"]
