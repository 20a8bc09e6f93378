"""AEGIS processor service."""
