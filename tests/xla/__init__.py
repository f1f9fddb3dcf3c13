"""torch_xla for real, in its own virtual environment (scripts/test_xla.sh)."""
