"""Profiles built on the agent service (examples/README.md)."""
