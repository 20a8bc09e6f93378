"""AEGIS simulator service."""
