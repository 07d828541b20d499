"""Deterministic text analysis shared by ingestion and query analysis: names and times."""
