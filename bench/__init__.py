"""gymflow benchmarks: `python -m bench.run [--quick]` (see README "Benchmarks")."""
