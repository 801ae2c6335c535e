"""Agent frameworks on the state service, end to end and offline (see docs/frameworks/)."""
