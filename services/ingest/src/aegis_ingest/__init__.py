"""AEGIS ingest service."""
