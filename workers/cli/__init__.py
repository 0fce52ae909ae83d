"""The `gymflow` command line (`gymflow.workers.cli.main:main`, or `python -m gymflow.workers.cli`)."""
