"""AEGIS alert dispatcher: risk and cloud-infra snapshots -> Slack alerts, once, without spam."""
