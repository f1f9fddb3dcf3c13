"""Start, feed, watch and stop the workers (kernel side), and the worker entry point."""
