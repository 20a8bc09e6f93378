"""AEGIS reporter: daily reports per factory and for the cloud infrastructure."""
