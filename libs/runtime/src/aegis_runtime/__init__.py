"""AEGIS runtime library."""
