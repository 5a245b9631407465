"""`python -m rove_jax.data.prepare`: the rove-prepare command (rove_jax.data.prepare_corpus).

Only a command: importing it would replace the function `rove_jax.data.prepare` (which builds a
run's tokenizer and token arrays) with this module on the package, so an import is refused.
"""

if __name__ != "__main__":
  raise ImportError("rove_jax.data.prepare is the `python -m rove_jax.data.prepare` command "
                    "only; import rove_jax.data.prepare_corpus (prepare_dataset, main) instead")

from rove_jax.data.prepare_corpus import run  # noqa: E402

run()
