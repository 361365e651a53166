"""The tools a model may call about its own context: compact_conversation and search_history."""
