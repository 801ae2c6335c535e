"""The OpenAI Agents SDK on the state service: `pip install 'agentstate-client[openai-agents]'`."""

from agentstate.integrations.openai_agents.session import AgentStateSession, session_key

__all__ = ["AgentStateSession", "session_key"]
