"""The packed-documents check before the first step (rove_jax.train.packing) and the count it
rests on (rove_jax.data.pipeline.max_documents)."""

import numpy as np
import pytest

from rove_jax import kernels
from rove_jax.data import pipeline
from rove_jax.kernels import platform, xla
from rove_jax.nn.model_config import GPTConfig
from rove_jax.train import packing

EOT = 7


def test_max_documents_counts_what_the_batches_hold(rng):
  """Equals the largest number of distinct segment ids in the batches the iterators make."""
  T = 16
  tokens = rng.integers(0, 6, 40 * T + 1)
  tokens[rng.choice(tokens.size, 90, replace=False)] = EOT
  batch = next(pipeline.eval_batches(tokens, seq_len=T, batch_size=40, packing=True, eot_id=EOT))
  want = max(len(np.unique(row)) for row in batch["segment_ids"])
  assert pipeline.max_documents(tokens, T, EOT) == want
  assert pipeline.max_documents(tokens, T, EOT, chunk_windows=3) == want
  assert pipeline.max_documents(tokens[:T], T, EOT) == 0  # no whole window


def test_an_eot_as_the_last_input_starts_no_document_in_the_row():
  T = 8
  tokens = np.zeros(2 * T + 1, np.int32)
  tokens[T - 1] = EOT  # the last input of window 0: its document begins in window 1
  assert pipeline.max_documents(tokens, T, EOT) == 1
  tokens[T - 2] = EOT
  assert pipeline.max_documents(tokens, T, EOT) == 2


@pytest.fixture
def hopper(monkeypatch):
  monkeypatch.setattr(platform, "target_platform", lambda: "gpu")
  monkeypatch.setattr(xla, "cudnn_packs", lambda: True)


def model(**kw):
  return GPTConfig(
    **{**dict(n_layer=1, n_head=2, d_model=128, d_ff=64, max_len=64, dtype="bfloat16"), **kw}
  )


def test_rows_over_cudnns_capacity_stop_before_the_first_step(hopper):
  T = 64
  capacity = xla.cudnn_max_segments(T)
  tokens = np.zeros(4 * T + 1, np.int32)
  tokens[T : T + capacity] = EOT  # window 1: capacity + 1 documents
  with pytest.raises(ValueError, match=rf"holds {capacity + 1} documents.*attention_impl=xla"):
    packing.check(model(), T, [tokens], EOT, log=lambda *a: None)
  tokens[T] = 0
  seen = []
  packing.check(model(), T, [tokens], EOT, log=seen.append)
  assert seen and f"at most {capacity} a window" in seen[0]


@pytest.mark.parametrize(
  "kw", [dict(attention_impl="xla"), dict(dtype="float32"), dict(attention_impl="chunked")]
)
def test_other_kernels_take_any_packing(hopper, kw):
  assert packing.cudnn_capacity(model(**kw), 64) is None
  tokens = np.full(4 * 64 + 1, EOT, np.int32)  # every token its own document
  packing.check(model(**kw), 64, [tokens], EOT)


def test_no_check_off_the_gpu():
  assert kernels.target_platform() == "cpu"
  assert packing.cudnn_capacity(model(), 64) is None
