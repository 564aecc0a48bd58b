"""Kernels of our own, registered as custom ops that every backend keeps in its graph."""
