"""Kernel config decisions (the one owner of tuning state): structural signatures
(``features``), the learned cost model (``model``), the persistent decision store (``store``)
and the policy that ties them together (``autotune.decide``)."""
from .autotune import (autotune_enabled, candidates_timed, decide, decision_key, device_name, lookup, set_timer,
                       tune_mode, tuner_invocations)
from .reuse import invested, reset_reuse_counts, reuse_counts, use


__all__ = ["autotune_enabled", "candidates_timed", "decide", "decision_key", "device_name", "lookup", "set_timer",
           "tune_mode", "tuner_invocations", "invested", "reuse_counts", "reset_reuse_counts", "use"]
