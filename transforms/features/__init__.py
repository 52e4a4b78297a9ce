"""Per-sample size features, the cost model, cost buckets and reading one sample."""
