"""Processes and entry points: worker, embedded server, client SDK, CLI."""
