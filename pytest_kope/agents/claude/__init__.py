"""The `claude` agent: the conversation with the Messages API (agent.py), the tools the model calls
(tools.py) and the prompt it reads (prompt.py)."""

from __future__ import annotations

from .agent import DEFAULT_MODEL, ClaudeAgent
from .tools import merge_space

__all__ = ["DEFAULT_MODEL", "ClaudeAgent", "merge_space"]
