"""AEGIS storage library."""
