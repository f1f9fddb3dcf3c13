"""The warm pool: WorkerPool, its background runs and their handles and output, healing in place."""
