"""Env packages: environments from other projects' packages, each in a venv of its own.

`gymflow envs install SPEC` (gymflow.envs.packages.install) makes a venv per package, installs it
there with its own pins (benchmax wants mcp 1.x, verifiers 0.4 pins mcp 2.0.0: neither can share
gymflow's venv, or each other's) and records what it declares (gymflow.envs.packages.store). The
package's envs then run out of process, in that venv, through the bridge (gymflow.envs.packages.bridge,
MCP over stdio); gymflow.envs.packages.env makes each one a gymflow env, so every rollout, batch and
training run uses it like a built-in one, and every trajectory records the package's name, version
and content digest.
"""
