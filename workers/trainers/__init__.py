"""Trainers behind the trainer contract, and adapters into other trainers."""
