"""AEGIS orchestrator: operator-defined triggers and workflows."""
