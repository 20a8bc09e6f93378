"""AEGIS dashboard read API: the read model (DynamoDB) and images/reports (S3), read-only."""
