"""Small example environments (the README's "an environment in 30 lines" is units.py)."""
