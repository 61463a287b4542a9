"""rpeg.flows: Prefect flows (``rl_train``, the deployed ``train`` and ``retrain``) and the one
training entry (``rpeg.flows.entry.train``). Import ``rpeg.flows.train`` explicitly (it imports
prefect)."""
