"""AEGIS folds: mergeable summaries of processed records (quantile sketches, hourly and 5-minute
folds), shared by the aggregator, which keeps a fold per factory and window, and the reporter,
which merges them into a day."""
