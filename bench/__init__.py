"""gymflow benchmarks: `python -m bench.run [--quick]` and the others; figures and history in docs/benchmarks.md."""
