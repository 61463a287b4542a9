"""rpeg.flows: see docs/architecture.md."""
