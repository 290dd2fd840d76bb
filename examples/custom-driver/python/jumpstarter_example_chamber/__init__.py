"""The Python client of the example chamber driver (examples/custom-driver)."""
