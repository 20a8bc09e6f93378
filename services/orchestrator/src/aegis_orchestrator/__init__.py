"""AEGIS orchestrator: operator-defined triggers and workflows (seed 003)."""
