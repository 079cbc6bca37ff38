"""Speculative decoding: speculators draft tokens, the engine verifies them in one batched step."""
