"""AEGIS storage tools: `aegis migrate` (legacy layouts onto the S3 contract) and `aegis replay`."""
