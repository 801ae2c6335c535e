"""Chat models: the interface, a deterministic scripted model and an OpenAI-compatible adapter."""
