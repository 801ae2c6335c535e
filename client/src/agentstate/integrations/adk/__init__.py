"""Google ADK on the state service: `pip install 'agentstate-client[adk]'`."""

from agentstate.integrations.adk.session_service import (
    SESSION_STATE_KEY,
    AgentStateSessionService,
    session_key,
)

__all__ = ["SESSION_STATE_KEY", "AgentStateSessionService", "session_key"]
