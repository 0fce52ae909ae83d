"""Number guessing as an OpenEnv environment: models, the Environment, and its server app."""
