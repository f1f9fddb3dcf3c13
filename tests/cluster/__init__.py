"""A real Ray cluster of two raylets on loopback addresses, driven from the test process."""
