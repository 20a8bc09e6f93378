"""AEGIS aggregator: 5-minute GRAPH#5M windows and processed_agg/ metrics from HISTORY#STATE."""
