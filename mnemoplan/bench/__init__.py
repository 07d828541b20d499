"""Benchmarks: retrieval quality, latency and ingest cost, through the same code paths as the tools."""
