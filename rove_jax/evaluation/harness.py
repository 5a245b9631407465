"""An lm-evaluation-harness model, registered as "rove_jax", over a rove-jax GPT and its tokenizer.

    rove-lm-eval --model rove_jax --model_args path=DIR --tasks hellaswag --batch_size 8

lm_eval 0.4.13 finds models only in its own registry (no entry-point plugins), so the
`rove-lm-eval` command (rove_jax.cli.harness) imports this module, which registers the class,
and then runs lm_eval's own command line. From Python, import this module and pass
model="rove_jax" to lm_eval.simple_evaluate, or pass a `RoveJaxLM` instance.

model_args:
  path        a rove-export directory (rove_jax.train.export: weights, config.json and the
              tokenizer it names) or a transformers-format directory that
              rove_jax.nn.pretrained.load reads, with its tokenizer.json or `tokenizer`.
  tokenizer   a tokenizer spec (rove_jax.data.tokenization: bytes, a tokenizer.json,
              tiktoken:NAME); default: the export's, else DIR/tokenizer.json.
  max_length  tokens in one model input (default: the export's training length, else the
              config's max_len); longer inputs keep their last max_length tokens, as lm_eval's
              own HF model does.
  max_gen_toks  generate_until's number of new tokens where a task sets none: 256, or half of
              max_length where that is less (lm_eval's HF model keeps 256, which leaves no
              context in a shorter model); given, it must be below max_length.
  dtype       the compute dtype (float32, bfloat16, float16); default the config's.

The three request types, each cut to max_length as lm_eval's HF model (HFLM) cuts it:
  loglikelihood          (sum of log p(continuation | context), greedy) per request. Context
                         and continuation keep their last max_length + 1 tokens together: the
                         context is cut from the left, the continuation never. A continuation
                         longer than max_length is refused (HFLM refuses it too), naming the
                         task, the document and the lengths.
  loglikelihood_rolling  the sum of log p over lm_eval's disjoint rolling windows of
                         max_length tokens (lm_eval.utils.get_rolling_token_windows,
                         context_len=1), the first conditioned on the end-of-text token.
  generate_until         greedy only, ended by any `until` string, the end-of-text token or
                         max_gen_toks; the context keeps its last max_length - max_gen_toks
                         tokens. A task whose max_gen_toks is max_length or more is refused
                         (HFLM refuses it too), naming the task and `--gen_kwargs
                         max_gen_toks=N` as the fix.
Every refusal is an `InputError` (a ValueError), raised for all requests of a type before the
model runs any of them; rove-lm-eval prints it as one line, exit 2.

Every model input is a fixed [batch_size, L] array, L one of a few length buckets (powers of
two from 64, capped at max_length), right-padded with the end-of-text token: causal attention
keeps the padding out of every scored position, and jit compiles once per bucket.
generate_until runs the whole [batch_size, L] buffer through the model for each new token
(no KV cache: the GPT's cache holds one fill length for the whole batch, and rows differ).
Runs on JAX's default device (JAX_PLATFORMS chooses); lm_eval's --device is not used.

Shape letters: B batch (batch_size), L bucket length, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
  handle_stop_sequences,
  normalize_gen_kwargs,
  postprocess_generated_text,
)

from rove_jax.data import tokenization
from rove_jax.nn import param_files, pretrained
from rove_jax.nn.model_config import DTYPES
from rove_jax.storage import paths
from rove_jax.train import export

MODEL_NAME = "rove_jax"
SMALLEST_BUCKET = 64
DEFAULT_MAX_GEN_TOKS = 256


class InputError(ValueError):
  """A model_args value or a request this model cannot take; `request` is the index of the
  request at fault, where there is one."""

  def __init__(self, message: str, *, request: Optional[int] = None):
    super().__init__(message)
    self.request = request


def _which(request, index: int) -> str:
  """A request named as lm_eval's Instance names it (its task and document)."""
  task = getattr(request, "task_name", None)
  if task is None:
    return f"request {index}"
  return f"task {task} (document {getattr(request, 'doc_id', '?')})"


def length_buckets(max_length: int) -> tuple:
  """The input lengths jit compiles for: 64, 128, ... below max_length, and max_length."""
  out, n = [], SMALLEST_BUCKET
  while n < max_length:
    out.append(n)
    n *= 2
  return tuple(out) + (max_length,)


def load_model(path: str, tokenizer: Optional[str] = None):
  """(GPTConfig, params, Tokenizer, training length or None) of a model directory.

  Raises:
    ValueError: no tokenizer is known for a directory that is not a rove-export.
  """
  path = paths.resolve(path, what="path")
  if not paths.isfile(paths.join(path, param_files.CONFIG)):
    what = f"holds no {param_files.CONFIG}" if paths.isdir(path) else "does not exist"
    raise InputError(
      f"model_args path={path} {what}; give the directory of a rove-export or a "
      f"transformers checkpoint"
    )
  config_json = json.loads(paths.read_text(paths.join(path, param_files.CONFIG)))
  run = config_json.get("rove_jax_run")
  if run is not None and tokenizer is None:
    loaded = export.load(path)
    return loaded.config, loaded.params, loaded.tokenizer, run.get("train_len")
  config, params = pretrained.load(path)
  if tokenizer is None:
    tokenizer = paths.join(path, "tokenizer.json")
    if not paths.exists(tokenizer):
      raise InputError(
        f"{path} is not a rove-export and holds no tokenizer.json; give "
        f"model_args tokenizer=SPEC ({', '.join(tokenization.SPEC_FORMS)})"
      )
  return config, params, tokenization.get_tokenizer(tokenizer), None


def _positive_int(name: str, value) -> int:
  try:
    out = int(value)
  except (TypeError, ValueError):
    out = None
  if (
    out is None or out < 1 or isinstance(value, bool) or (isinstance(value, float) and value != out)
  ):
    raise InputError(
      f"{name} must be a positive integer, got {value!r}"
      + ("; rove_jax has no automatic batch size" if str(value).startswith("auto") else "")
    )
  return out


@register_model(MODEL_NAME)
class RoveJaxLM(TemplateLM):
  """lm_eval's LM interface over a rove-jax GPT (model_args in the module docstring)."""

  def __init__(
    self,
    path: str,
    batch_size=1,
    max_length: Optional[int] = None,
    max_gen_toks=None,
    tokenizer: Optional[str] = None,
    dtype: Optional[str] = None,
    max_batch_size=None,
    device=None,
  ):
    super().__init__()
    self.batch_size = _positive_int("batch_size", batch_size)
    if max_gen_toks is not None:
      max_gen_toks = _positive_int("max_gen_toks", max_gen_toks)
    if max_batch_size is not None:
      raise InputError(
        "max_batch_size is for lm_eval's automatic batch size, which rove_jax "
        "does not have; give --batch_size N"
      )
    del device  # JAX places the model on its default device (JAX_PLATFORMS chooses)
    config, params, self.tok, train_len = load_model(path, tokenizer)
    if dtype is not None:
      if dtype not in DTYPES:
        raise InputError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
      config = dataclasses.replace(config, dtype=dtype)
    if self.tok.vocab_size > config.vocab_size:
      raise InputError(
        f"the tokenizer has {self.tok.vocab_size} ids but the model only "
        f"{config.vocab_size}: not this model's tokenizer"
      )
    self.config = config
    self.max_length = _positive_int("max_length", max_length or train_len or config.max_len)
    if config.pos_encoding == "learned" and self.max_length > config.max_len:
      raise InputError(
        f"max_length {self.max_length} exceeds the {config.max_len} learned positions of the model"
      )
    if max_gen_toks is None:  # a default that leaves half of the model input to the context
      max_gen_toks = min(DEFAULT_MAX_GEN_TOKS, max(1, self.max_length // 2))
    elif max_gen_toks >= self.max_length:
      raise InputError(
        f"max_gen_toks {max_gen_toks} leaves no room for a context in "
        f"max_length {self.max_length}; give max_gen_toks below "
        f"{self.max_length}"
      )
    self.max_gen_toks = max_gen_toks
    self.buckets = length_buckets(self.max_length)
    graphdef, self._state = nnx.split(pretrained.build(config, params))
    valid_V = self.tok.vocab_size  # ids past it pad the embedding; the tokenizer never makes them

    def greedy_ids(logits_BLV):
      ids = jnp.arange(logits_BLV.shape[-1])
      return jnp.argmax(jnp.where(ids < valid_V, logits_BLV, -jnp.inf), axis=-1)

    @jax.jit
    def score(state, tokens_BL, targets_BL):
      logits_BLV = nnx.merge(graphdef, state)(tokens_BL)
      logp_BLV = jax.nn.log_softmax(logits_BLV, axis=-1)
      logp_BL = jnp.take_along_axis(logp_BLV, targets_BL[..., None], axis=-1)[..., 0]
      return logp_BL, greedy_ids(logits_BLV) == targets_BL

    @jax.jit
    def next_ids(state, tokens_BL, last_B):
      logits_BLV = nnx.merge(graphdef, state)(tokens_BL)
      return greedy_ids(jnp.take_along_axis(logits_BLV, last_B[:, None, None], axis=1)[:, 0])

    self._score, self._next_ids = score, next_ids

  # -------------------------------------------------------------------- tokens
  @property
  def eot_token_id(self) -> int:
    return int(self.tok.eot_id)

  @property
  def tokenizer_name(self) -> str:
    return self.tok.name

  def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list:
    del add_special_tokens, kwargs  # rove-jax tokenizers add no special tokens
    return [int(i) for i in self.tok.encode(string)]

  def tok_decode(self, ids) -> str:
    return self.tok.decode(np.asarray(ids, np.int64))

  def _bucket(self, n: int) -> int:
    return next(b for b in self.buckets if b >= n)

  # ------------------------------------------------------------- loglikelihood
  def loglikelihood(self, requests, disable_tqdm: bool = False) -> list:
    """TemplateLM's (tokenizes, then `_loglikelihood_tokens`), with a refusal naming the
    request's task and document."""
    try:
      return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
    except InputError as e:
      if e.request is None:
        raise
      raise InputError(f"{_which(requests[e.request], e.request)}: {e}") from None

  def _too_long(self, n_context: int, n_continuation: int) -> str:
    """Why a continuation longer than max_length is refused, and the fix."""
    fix = (
      f"give model_args max_length={n_continuation} or more"
      if self.config.pos_encoding != "learned" or n_continuation <= self.config.max_len
      else f"the model's {self.config.max_len} learned positions cannot hold it; leave the task out"
    )
    return (
      f"a continuation of {n_continuation} tokens (after {n_context} of context) is "
      f"longer than max_length {self.max_length}: only the context is cut to fit, as in "
      f"lm_eval's HF model, which refuses it too; {fix}"
    )

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list:
    """(sum log p of the continuation, greedy) per (strings or None, context ids,
    continuation ids); the joined ids keep their last max_length + 1. Every request is checked
    before the model runs.

    Raises:
      InputError: an empty context or continuation, or a continuation longer than
        max_length (`request` names it).
    """
    rows = []
    for i, (_, context, continuation) in enumerate(requests):
      if not continuation or not context:
        raise InputError(
          f"a loglikelihood request needs context and continuation tokens, "
          f"got {len(context)} and {len(continuation)}",
          request=i,
        )
      if len(continuation) > self.max_length:
        raise InputError(self._too_long(len(context), len(continuation)), request=i)
      whole = (list(context) + list(continuation))[-(self.max_length + 1) :]
      rows.append((whole[:-1], whole[1:], len(continuation)))
    out = [None] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # like lengths together
    for start in range(0, len(order), self.batch_size):
      batch = order[start : start + self.batch_size]
      L = self._bucket(len(rows[batch[0]][0]))
      tokens_BL = np.full((self.batch_size, L), self.eot_token_id, np.int32)
      targets_BL = np.full((self.batch_size, L), self.eot_token_id, np.int32)
      for r, i in enumerate(batch):
        tokens_BL[r, : len(rows[i][0])] = rows[i][0]
        targets_BL[r, : len(rows[i][1])] = rows[i][1]
      logp_BL, greedy_BL = self._score(self._state, tokens_BL, targets_BL)
      logp_BL, greedy_BL = np.asarray(logp_BL, np.float64), np.asarray(greedy_BL)
      for r, i in enumerate(batch):
        n, k = len(rows[i][0]), rows[i][2]
        out[i] = (float(logp_BL[r, n - k : n].sum()), bool(greedy_BL[r, n - k : n].all()))
        if requests[i][0] is not None:
          self.cache_hook.add_partial("loglikelihood", requests[i][0], out[i])
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list:
    """The log-likelihood of each whole string over lm_eval's rolling windows."""
    windows, owner = [], []
    strings = [req.args[0] for req in requests]
    for i, string in enumerate(strings):
      for pair in lm_utils.get_rolling_token_windows(
        token_list=self.tok_encode(string),
        prefix_token=self.prefix_token_id,
        max_seq_len=self.max_length,
        context_len=1,
      ):
        windows.append((None, *lm_utils.make_disjoint_window(pair)))
        owner.append(i)
    totals = [0.0] * len(strings)
    for i, (logp, _) in zip(owner, self._loglikelihood_tokens(windows)):
      totals[i] += logp
    for string, total in zip(strings, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
    return totals

  # ---------------------------------------------------------------- generation
  def generate_until(self, requests, disable_tqdm: bool = False) -> list:
    """Greedy continuations, cut at the first `until` string; batched by equal settings.
    Every request is checked before the model runs.

    Raises:
      InputError: sampling, or a max_gen_toks of max_length or more, naming the task.
    """
    groups = {}
    for i, req in enumerate(requests):
      kwargs = normalize_gen_kwargs(req.args[1], self.max_gen_toks)
      if kwargs.get("do_sample") or kwargs.get("temperature", 0.0) > 0:
        raise InputError(
          f"{_which(req, i)}: rove_jax's generate_until is greedy only; give "
          f"--gen_kwargs do_sample=False,temperature=0"
        )
      max_gen_toks = int(kwargs["max_gen_toks"])
      if max_gen_toks >= self.max_length:  # lm_eval's HF model asserts the same
        raise InputError(
          f"{_which(req, i)}: max_gen_toks {max_gen_toks} leaves no room for a context in "
          f"max_length {self.max_length}; give --gen_kwargs max_gen_toks=N with N below "
          f"{self.max_length} (the context keeps its last {self.max_length} - N tokens)"
        )
      until = tuple(handle_stop_sequences(kwargs.get("until"), eos=None))
      groups.setdefault((until, max_gen_toks), []).append(i)
    out = [None] * len(requests)
    for (until, max_gen_toks), members in groups.items():
      members.sort(key=lambda i: -len(requests[i].args[0]))
      for start in range(0, len(members), self.batch_size):
        batch = members[start : start + self.batch_size]
        texts = self._greedy([requests[i].args[0] for i in batch], list(until), max_gen_toks)
        for i, text in zip(batch, texts):
          out[i] = text
          self.cache_hook.add_partial("generate_until", requests[i].args, text)
    return out

  def _greedy(self, contexts: list, until: list, max_gen_toks: int) -> list:
    """Greedy continuations of up to batch_size contexts (each keeps its last
    max_length - max_gen_toks tokens), each cut at the end-of-text token and the first
    `until` string."""
    room = self.max_length - max_gen_toks  # at least 1: generate_until checked
    prompts = [(self.tok_encode(c) or [self.prefix_token_id])[-room:] for c in contexts]
    L = self._bucket(max(map(len, prompts)) + max_gen_toks)
    tokens_BL = np.full((self.batch_size, L), self.eot_token_id, np.int32)
    lengths_B = np.ones(self.batch_size, np.int32)
    for r, prompt in enumerate(prompts):
      tokens_BL[r, : len(prompt)] = prompt
      lengths_B[r] = len(prompt)
    generated = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_gen_toks):
      ids_B = np.asarray(self._next_ids(self._state, tokens_BL, lengths_B - 1))
      for r in range(len(prompts)):
        if done[r]:
          continue
        if ids_B[r] == self.eot_token_id:
          done[r] = True
          continue
        generated[r].append(int(ids_B[r]))
        tokens_BL[r, lengths_B[r]] = ids_B[r]
        lengths_B[r] += 1
        done[r] = any(s and s in self.tok_decode(generated[r]) for s in until)
      if all(done):
        break
    return [postprocess_generated_text(self.tok_decode(g), until, None) for g in generated]
