"""A real Jupyter kernel (tests/kernel_harness, nbclient), the demo notebooks included."""
