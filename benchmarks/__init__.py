"""The benchmark suites of sparsegnn and their helpers; run a suite from the repository root as
``python -m benchmarks.<name>`` (README.md lists them). Results: ``benchmarks/results/``."""
import sys


def run_command(parser, run, argv=None) -> int:
    """A driver's ``main``: parse ``argv`` with ``parser``, call ``run(args)``; a ``ValueError`` becomes
    one line on stderr and exit status 2 (as ``sparsegnn``'s commands do)."""
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
