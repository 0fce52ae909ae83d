"""gymflow environments: the contract (no temporalio here) and built-in envs."""
