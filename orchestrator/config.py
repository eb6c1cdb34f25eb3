"""The orchestrator's validated configuration."""

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class OrchestratorConfig:
    draft_address: str  # host:port of a draft worker
    target_address: str  # host:port of a target verifier
    redis_url: str
    tokenizer: str | None = None  # a Hugging Face tokenizer directory; None: token ids only
    max_gamma: int = 8
    max_tokens_cap: int = 4096
    default_max_tokens: int = 128
    session_ttl_s: int = 3600
    worker_timeout_s: float = 30.0
    app_name: str = "tandem"
    metrics_port: int = 0  # Prometheus metrics of the replica's process; 0: none
    draft_ahead: bool = True  # draft past each block while the target verifies it (cycle.py)

    def __post_init__(self) -> None:
        for name in ("draft_address", "target_address"):
            if ":" not in getattr(self, name):
                raise ValueError(f"{name} must be host:port, got {getattr(self, name)!r}")
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url must be a redis:// URL, got {self.redis_url!r}")
        if self.tokenizer is not None and not os.path.isdir(self.tokenizer):
            raise ValueError(f"tokenizer directory not found: {self.tokenizer}")
        if not 0 <= self.max_gamma <= 64:
            raise ValueError(f"max_gamma must be in [0, 64], got {self.max_gamma}")
        if not 1 <= self.default_max_tokens <= self.max_tokens_cap:
            raise ValueError("default_max_tokens must be in [1, max_tokens_cap]")
        if not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be in [0, 65535], got {self.metrics_port}")
        if self.session_ttl_s < 1 or self.worker_timeout_s <= 0:
            raise ValueError("session_ttl_s and worker_timeout_s must be positive")

    def load_tokenizer(self):
        """The tokenizer, or None when there is none (token-id prompts only)."""
        if self.tokenizer is None:
            return None
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(self.tokenizer)
        except (OSError, ValueError):
            return None
