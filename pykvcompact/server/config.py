"""What ``pykvcompact serve`` is configured with (one object, passed to the app and the registry)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from ..compaction.policy import Policy

# Sequences one session may hold at once: the live one, a probe fork, a summary fork, a prepared rebase.
SEQUENCES_PER_SESSION = 4


@dataclass
class ServerConfig:
    model: Optional[str] = "smollm2-135m"
    host: str = "127.0.0.1"
    port: int = 8000
    n_ctx: int = 8192
    window: int = 2048
    mode: str = "background"
    rubric: str = "boundary"
    api_key: Optional[str] = None
    max_sessions: Optional[int] = None      # None: as many as the cells and sequences allow
    history_dir: str = "conversation_history"
    default_max_tokens: int = 512
    summary_max_tokens: Optional[int] = None  # None: the library default (window // 8)
    # generation chunk between the session's fill checks; a grammar (forced tool call) restarts at each
    # chunk, so it must hold a whole forced call
    chunk_tokens: int = 64
    n_threads: Optional[int] = None
    served_name: Optional[str] = None       # the name /v1/models reports (default: the model's name)
    policy_overrides: dict = field(default_factory=dict)

    @property
    def model_id(self) -> str:
        if self.served_name:
            return self.served_name
        return os.path.basename(str(self.model)) if self.model else "qwen2.5-coder-1.5b"


def policy_for(config: ServerConfig) -> Policy:
    """The compaction policy every session of the server runs under (a bad mode or rubric raises here)."""
    keywords = dict(mode=config.mode, window=config.window, rubric=config.rubric,
                    summary_max_tokens=config.summary_max_tokens, chunk_tokens=config.chunk_tokens)
    keywords.update(config.policy_overrides)
    return Policy(**keywords)
