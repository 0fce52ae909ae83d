"""Deployment of worker fleets (SkyPilot task files and launcher)."""
