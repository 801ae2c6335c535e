"""The agent service: a ReAct runtime that keeps its session state in the state service."""
