"""Independent float64 NumPy oracles used by the tests; never imported by the package."""
