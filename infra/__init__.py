"""rpeg.infra: see docs/architecture.md."""
