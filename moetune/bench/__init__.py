"""Throughput benchmarks (prefill and decode tokens/s), against transformers on the same weights."""
