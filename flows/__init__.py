"""rpeg.flows: Prefect flows (``rl_train``) and their Python entries (``run_train``).
Import ``rpeg.flows.train`` explicitly (it imports prefect)."""
