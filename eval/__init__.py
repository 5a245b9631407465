"""`python -m eval` from a checkout; the evaluation library is rove_jax.evaluation."""
