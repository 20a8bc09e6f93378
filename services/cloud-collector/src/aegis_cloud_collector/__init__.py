"""AEGIS cloud collectors: CLOUD#infra LATEST/HISTORY and processed/cloud_infra/."""
