"""Evaluation of trained runs: python -m eval (see eval/__main__.py)."""
