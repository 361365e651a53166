"""Summaries: the summarizer prompt and fallback, one summary job, the summary message (keeper, results,
novelty) and the model's notes on tool outputs."""
