"""Benchmark harness: ``run`` cases x providers, then ``report.markdown`` / ``report.plot``."""
from .harness import Row, run, write_json

__all__ = ["Row", "run", "write_json"]
