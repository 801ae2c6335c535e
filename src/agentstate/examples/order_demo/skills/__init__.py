"""The order demo's handbooks (Markdown, served by load_skill)."""
