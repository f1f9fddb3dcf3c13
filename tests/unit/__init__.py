"""Fast tests in one process: no worker process, no kernel."""
