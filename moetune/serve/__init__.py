"""OpenAI-compatible HTTP serving with continuous batching. Not built yet."""
