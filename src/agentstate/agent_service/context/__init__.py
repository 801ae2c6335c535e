"""Context management: token budgets, trimming, compaction, RAG-mode history."""
