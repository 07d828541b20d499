"""Bringing memory in and taking it out: importers of other tools' exports, and a lossless export."""
