"""Tools the agent may call, with their permissions."""
