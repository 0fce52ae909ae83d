"""benchmax envs for the gymflow tests: the package declares benchmax's own `MathEnv` and `NotesEnv`."""
