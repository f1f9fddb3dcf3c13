"""What crosses from the kernel to a worker: the payload, its cells, the worker's environment, ports, rank-bound objects and shared tensors (imported by both sides)."""
