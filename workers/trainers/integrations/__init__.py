"""Adapters that plug gymflow environments into RL trainers (each imports its trainer lazily)."""
