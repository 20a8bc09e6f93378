"""AEGIS contracts library."""
