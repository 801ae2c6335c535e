"""The state service: whole-AgentState storage, conversations and message records over gRPC."""
