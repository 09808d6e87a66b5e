"""How a pipeline runs: keys, the artifact store, the runner, and the thin Prefect and CLI layers."""
