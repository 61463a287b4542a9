"""rpeg.tasks: see docs/architecture.md."""
