"""The bridge: an env package's envs served to gymflow from the package's own venv.

gymflow runs `python -m gymflow_bridge` with the package venv's interpreter (the package's pins,
nobody else's), with `PYTHONPATH` naming only a copy of this directory, so nothing of gymflow's own
venv leaks in. That is why everything here is standard library and relative imports: the same files
import as `gymflow.envs.packages.bridge` (tests, type checks) and as `gymflow_bridge` (in the venv).

Protocol, and why: the rollout side is MCP over stdio (`serve`), so gymflow's MCP machinery runs it
unchanged: one bridge process per rollout from the warm pool, its own workspace as cwd, its process
group killed on release and reaped after a crash (the ledger), stderr kept for post-mortems, per-call
timeouts that kill a hung env. The env's tools are listed as MCP tools; the env's lifecycle and
reward are MCP tools too, under the reserved prefix `gymflow.` (`gymflow.init`, `gymflow.reward`,
`gymflow.respond`, `gymflow.copy_in`, `gymflow.copy_out`, `gymflow.release`), which gymflow never
offers the model. Static facts (`describe`) and datasets (`dataset`) are one-shot commands printing
JSON: they need no rollout, and the install records them so listings start nothing.
"""
