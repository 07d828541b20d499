"""The web view: a few server-rendered pages over the browse queries, search and forget."""
