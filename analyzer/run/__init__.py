"""Where the per-rank map runs (executors) and the per-rank cache."""

EXECUTORS = ("local", "dask")  # analyzer.run.executors; here, so the CLI's options need not import it
