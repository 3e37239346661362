"""The decision engine: llama.cpp sessions, prompts, scoring, shipped models.

Imports only the contract modules at adapter/ top level (schema, ids, guard, safe_path); knows
nothing of HTTP or of calibrated policies."""
