"""The settings the gateway tests share: the shared server's capacity, the gateway's key and
session defaults. A module of its own name, since `conftest` names a different module in each
test directory and only the one loaded last is found by a later import."""
from __future__ import annotations

API_KEY = "test-key-0123456789"
CAPACITY = 3
# Random weights never open a turn on their own: every session gets the reply-shape knobs.
SESSION_DEFAULTS = ["reply_units=2", "reply_tokens_per_unit=3"]
SERVER_OVERRIDES = {"max_sessions": str(CAPACITY), "idle_timeout_s": "20"}
EXIT_ARGS = ["--exit-timeout-secs=5"]  # as tests/server/server_args.py: a fast stop
