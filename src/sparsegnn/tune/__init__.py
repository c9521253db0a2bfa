"""Choosing kernel configurations: first-call autotuning over candidates from ``kernels.configs``."""
from .autotune import autotune_enabled, pick_config

__all__ = ["autotune_enabled", "pick_config"]
