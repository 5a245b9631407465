"""How the commands end on an expected failure: one `error: ...` line on stderr and an exit
status, no traceback (ROVE_JAX_TRACEBACK=1 shows it)."""

import os
import sys

TRACEBACK_VAR = "ROVE_JAX_TRACEBACK"  # =1: expected errors show their traceback too


def fail(message: str, code: int, *, prefix: str = "error") -> int:
  """Prints `PREFIX: message` as one line on stderr; returns code. Called from an except block:
  with ROVE_JAX_TRACEBACK=1 it re-raises the exception being handled instead."""
  print(f"{prefix}: {' '.join(str(message).split())}", file=sys.stderr)
  if os.environ.get(TRACEBACK_VAR) == "1":
    raise  # noqa: PLE0704 - the error being handled
  return code


def missing_package(e: ImportError) -> str:
  """An ImportError's message, with how to install the extras when it does not say."""
  return (
    str(e)
    if "pip install" in str(e)
    else f"{e}; is rove_jax installed with its extras (pip install 'rove_jax[all]')?"
  )
