"""The lm-evaluation-harness model "rove_jax" (rove_jax.evaluation.harness) and its command
(rove_jax.cli.harness), offline.

Scores are checked against the project's own teacher-forced scoring
(rove_jax.evaluation.scoring.token_scores) of each whole sequence, one to a model call (not
the adapter's batches and length buckets), with lm_eval's semantics (left truncation,
trailing context spaces moved into the continuation, disjoint rolling windows) written out
here independently of lm_eval's helpers.
One run of the command covers a multiple-choice task and a rolling-loglikelihood task written
into tmp_path (local task YAML + JSON lines); its logged samples must equal the reference.

The model is a tiny RoVE GPT with random weights scaled up (so that its predictions differ
sharply from token to token and a misaligned or mispadded position changes the sums) and an
output head limited to ASCII (see `export_dir`), saved as a rove-export (pretrained.save
with the "rove_jax_run" record `export.load` reads: the byte tokenizer); training one would
only add time.
"""

import glob
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

try:
  import lm_eval  # noqa: F401
except ImportError as e:  # in the [test] extra: make test must fail here, not skip
  raise ImportError(
    "lm_eval is not installed: pip install -e '.[test]' (or the [harness] extra)"
  ) from e

from rove_jax.data import tokenization
from rove_jax.evaluation import harness
from rove_jax.evaluation.scoring import token_scores
from rove_jax.nn import pretrained
from rove_jax.nn.decoding import generate
from rove_jax.nn.model import GPT
from rove_jax.train import export
from tests.conftest import gpt_config, subprocess_env

ROOT = Path(__file__).resolve().parents[2]
MAX_LENGTH = 128  # two length buckets (64, 128) and windows shorter than the documents
RTOL = 1e-4
EOT = tokenization.ByteTokenizer.eot_id

MC_DOCS = [
  {"question": "def f(x):", "choices": ["return x", "import os", "class A:"], "answer": 0},
  {"question": "for i in", "choices": ["range(10):", "else", "print(y)"], "answer": 0},
  {"question": "x = ", "choices": ["1 + 1", "self.value", "(y)"], "answer": 1},
  # a context longer than max_length: lm_eval keeps the last max_length + 1 tokens
  {"question": "import os\n" * 20 + "print", "choices": ["(x)", " y"], "answer": 0},
]
ROLLING_DOCS = [
  {"text": "the quick brown fox jumps over the lazy dog"},
  {"text": "def value(self):\n    return self.x + self.y\n" * 7},  # 3 windows, the last partial
  {"text": "x" * MAX_LENGTH * 2},  # whole windows only
]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> str:
  """A rove-export of a random 2-layer RoVE GPT on bytes: weights scaled up by 2, and an
  untied output head whose columns past the ASCII bytes are zero, so that greedy text is
  ASCII (a stop string can be cut from it) and never the end-of-text token."""
  out = tmp_path_factory.mktemp("lm-eval-export")
  config = gpt_config(n_layer=2, max_len=64, tie_embeddings=False)
  params = jax.tree.map(lambda x: 2.0 * x, nnx.state(GPT(config, rngs=nnx.Rngs(0)), nnx.Param))
  head = params["lm_head"]
  head[...] = head[...].at[:, 128:].set(0.0)
  tok = tokenization.ByteTokenizer()
  run = {
    "step": 0,
    "workdir": "random",
    "train_len": 64,
    "tokenizer": {
      "spec": "bytes",
      "vocab_size": tok.vocab_size,
      "eot_id": tok.eot_id,
      "fingerprint": tok.fingerprint,
    },
  }
  pretrained.save(str(out), config, params, format="rove_jax", extra_config={"rove_jax_run": run})
  return str(out)


@pytest.fixture(scope="module")
def loaded(export_dir):
  return export.load(export_dir)


@pytest.fixture(scope="module")
def lm(export_dir):
  return harness.RoveJaxLM(path=export_dir, batch_size=3, max_length=MAX_LENGTH)


class Request:
  """What lm_eval hands a model: an object with .args."""

  def __init__(self, *args):
    self.args = args


# ------------------------------------------------------------------------ references


class Reference:
  """The project's own scoring (scoring.token_scores) of one token window per model call,
  right-padded to MAX_LENGTH + 1 tokens as scoring.Scorer pads (one compile; causal attention
  keeps the padding out of the scored positions)."""

  def __init__(self, loaded):
    self.encode = loaded.encode
    graphdef, state = nnx.split(loaded.model())
    scores = jax.jit(lambda state, tokens_BW: token_scores(nnx.merge(graphdef, state), tokens_BW))
    self.scores = lambda tokens_BW: scores(state, tokens_BW)

  def window(self, window):
    """(log p [T] float64, greedy [T]) of tokens window[1:] given window[:-1]."""
    padded = np.full((1, MAX_LENGTH + 1), EOT, np.int32)
    padded[0, : len(window)] = window
    nll, greedy = self.scores(padded)
    T = len(window) - 1
    return -np.asarray(nll, np.float64)[0, :T], np.asarray(greedy)[0, :T]

  def loglikelihood(self, context: str, continuation: str):
    """lm_eval's (sum log p, is_greedy): trailing spaces of the context belong to the
    continuation; the joined tokens keep their last MAX_LENGTH + 1."""
    kept = context.rstrip()
    ctx, cont = self.encode(kept), self.encode(context[len(kept) :] + continuation)
    logp, greedy = self.window(np.concatenate([ctx, cont])[-(MAX_LENGTH + 1) :])
    return float(logp[-cont.size :].sum()), bool(greedy[-cont.size :].all())

  def rolling(self, text: str) -> float:
    """Every token scored once: chunks of MAX_LENGTH predicted tokens, the first after the
    end-of-text token, each full chunk from its own inputs only (the token before it as its
    one token of context), the last partial chunk after the MAX_LENGTH tokens before its end."""
    seq = np.concatenate([[EOT], self.encode(text)]).astype(np.int32)
    n, total = seq.size - 1, 0.0
    for start in range(0, n, MAX_LENGTH):
      end = min(start + MAX_LENGTH, n)
      first = start if (start == 0 or end - start == MAX_LENGTH) else end - MAX_LENGTH
      total += float(self.window(seq[first : end + 1])[0][-(end - start) :].sum())
    return total


@pytest.fixture(scope="module")
def ref(loaded):
  return Reference(loaded)


# ---------------------------------------------------------------------- in process


def test_length_buckets():
  assert harness.length_buckets(128) == (64, 128)
  assert harness.length_buckets(300) == (64, 128, 256, 300)
  assert harness.length_buckets(40) == (40,)


def test_loglikelihood_equals_the_projects_scoring(lm, ref):
  pairs = [(d["question"], " " + c) for d in MC_DOCS for c in d["choices"]]
  pairs.append(("print(x) ", "+ 1"))  # a trailing space moves into the continuation
  got = lm.loglikelihood([Request(*p) for p in pairs])  # 13 requests: batches of 3, padded
  want = [ref.loglikelihood(*p) for p in pairs]
  np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], rtol=RTOL)
  assert [g[1] for g in got] == [w[1] for w in want]
  assert len({round(g[0], 3) for g in got}) == len(got)  # the sums tell the requests apart


def test_is_greedy_is_true_for_the_greedy_continuation(lm, loaded, ref):
  context = loaded.encode("def f(x):")
  out = np.asarray(
    generate(
      loaded.model(), context[None], 6, temperature=0.0, valid_vocab=loaded.tokenizer.vocab_size
    )
  )[0, context.size :]
  other = out.copy()
  other[-1] = (other[-1] + 1) % loaded.tokenizer.vocab_size
  got = lm._loglikelihood_tokens(
    [(None, context.tolist(), out.tolist()), (None, context.tolist(), other.tolist())]
  )
  assert [g[1] for g in got] == [True, False]
  want = ref.window(np.concatenate([context, out]))[0][-out.size :].sum()
  np.testing.assert_allclose(got[0][0], want, rtol=RTOL)


def test_loglikelihood_rolling_equals_the_projects_scoring(lm, loaded, ref):
  texts = [d["text"] for d in ROLLING_DOCS] + [""]
  assert len(loaded.encode(texts[1])) > 2 * MAX_LENGTH
  got = lm.loglikelihood_rolling([Request(t) for t in texts])
  want = [ref.rolling(t) for t in texts]
  np.testing.assert_allclose(got, want, rtol=RTOL)
  assert got[-1] == 0.0


def test_generate_until_is_exports_greedy_text_cut_at_a_stop_string(lm, loaded, monkeypatch):
  prompts = ["def f(x):", "for i in range(3"]
  full = [loaded.generate(p, 12) for p in prompts]  # the KV-cache decoder's greedy text
  assert all(t.isascii() and tokenization.EOT_TEXT not in t for t in full), full  # the head's
  settings = {"until": [], "max_gen_toks": 12}
  assert lm.generate_until([Request(p, dict(settings)) for p in prompts]) == full  # one batch
  stop = full[0][6:8]  # a stop string from inside the first text: the text before it
  cut = full[0][: full[0].index(stop)]
  assert cut and len(cut) < len(full[0])
  steps, next_ids = [], lm._next_ids
  monkeypatch.setattr(lm, "_next_ids", lambda *a: steps.append(1) or next_ids(*a))
  got = lm.generate_until(
    [
      Request(prompts[0], {"until": ["@@", stop], "max_gen_toks": 12}),
      Request(prompts[1], dict(settings, max_gen_toks=5)),
    ]
  )
  assert got == [cut, lm.tok_decode(loaded.encode(full[1])[:5])]
  assert len(steps) == len(cut) + len(stop) + 5  # the first row ends once its stop is out


def test_a_transformers_style_directory_takes_a_tokenizer(lm, export_dir, tmp_path, loaded):
  pretrained.save(str(tmp_path), loaded.config, loaded.params, format="rove_jax")  # no run
  with pytest.raises(ValueError, match="tokenizer=SPEC"):
    harness.RoveJaxLM(path=str(tmp_path))
  other = harness.RoveJaxLM(path=str(tmp_path), tokenizer="bytes", max_length=MAX_LENGTH)
  request = [Request("def f(x):", " return x")]
  (got,), (want,) = other.loglikelihood(request), lm.loglikelihood(request)
  assert got[1] == want[1] and got[0] == pytest.approx(want[0], rel=RTOL)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"batch_size": "auto"}, "no automatic batch size"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"dtype": "float64"}, "dtype must be one of"),
  ],
)
def test_bad_model_args_are_refused(export_dir, kwargs, match):
  with pytest.raises(ValueError, match=match):
    harness.RoveJaxLM(path=export_dir, **kwargs)


def test_sampling_is_refused(lm):
  with pytest.raises(harness.InputError, match="greedy only"):
    lm.generate_until([Request("x", {"do_sample": True, "temperature": 0.7})])


# ---------------------------------------------------------------------------- command


def write_tasks(directory: Path) -> None:
  """Two lm_eval tasks over local JSON lines: rove_mc (multiple choice) and rove_ppl
  (loglikelihood_rolling, word perplexity)."""
  directory.mkdir()
  for name, docs in (("mc", MC_DOCS), ("ppl", ROLLING_DOCS)):
    (directory / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
  common = (
    "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
  )
  (directory / "rove_mc.yaml").write_text(
    "task: rove_mc\n"
    + common.format(data=directory / "mc.jsonl")
    + 'output_type: multiple_choice\ndoc_to_text: "{{question}}"\n'
    'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
    "metric_list:\n  - metric: acc\n"
  )
  (directory / "rove_ppl.yaml").write_text(
    "task: rove_ppl\n"
    + common.format(data=directory / "ppl.jsonl")
    + 'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
    "metric_list:\n  - metric: word_perplexity\n"
  )


def read_samples(out: Path, task: str) -> list:
  (path,) = glob.glob(str(out / "*" / f"samples_{task}_*.jsonl"))
  return sorted(
    (json.loads(line) for line in Path(path).read_text().splitlines()), key=lambda s: s["doc_id"]
  )


@pytest.mark.slow
def test_the_command_runs_local_tasks_to_the_projects_scores(export_dir, ref, tmp_path):
  """rove-lm-eval (python -m rove_jax.cli.harness) end to end, offline: per-sample scores, the
  accuracy and the word perplexity equal the reference's."""
  write_tasks(tmp_path / "tasks")
  env = subprocess_env(
    HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(ROOT)
  )
  cmd = [
    sys.executable,
    "-m",
    "rove_jax.cli.harness",
    "--model",
    "rove_jax",
    "--model_args",
    f"path={export_dir},max_length={MAX_LENGTH}",
    "--tasks",
    "rove_mc",
    "rove_ppl",
    "--include_path",
    str(tmp_path / "tasks"),
    "--only_include_path",  # lm_eval's own task files are not indexed: a faster start
    "--batch_size",
    "4",
    "--log_samples",
    "--output_path",
    str(tmp_path / "out"),
  ]
  run = subprocess.Popen(
    cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  try:  # the references meanwhile: the strings lm_eval builds from the task's templates
    pairs = [[(d["question"], " " + c) for c in d["choices"]] for d in MC_DOCS]
    want_mc = [[ref.loglikelihood(*p) for p in doc_pairs] for doc_pairs in pairs]
    want_rolling = [ref.rolling(d["text"]) for d in ROLLING_DOCS]
    output = run.communicate(timeout=300)[0]
  finally:
    run.kill()
  assert run.returncode == 0, output[-5000:]

  mc = read_samples(tmp_path / "out", "rove_mc")
  assert [s["doc"] for s in mc] == MC_DOCS
  for sample, doc_pairs, want in zip(mc, pairs, want_mc):
    assert [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()] == doc_pairs
    got = [(float(r[0][0]), r[0][1] == "True") for r in sample["resps"]]
    np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], rtol=RTOL)
    assert [g[1] for g in got] == [w[1] for w in want]
  rolling = read_samples(tmp_path / "out", "rove_ppl")
  assert [s["doc"] for s in rolling] == ROLLING_DOCS
  np.testing.assert_allclose([float(s["resps"][0][0]) for s in rolling], want_rolling, rtol=RTOL)

  (results,) = glob.glob(str(tmp_path / "out" / "*" / "results_*.json"))
  scores = json.loads(Path(results).read_text())["results"]
  correct = [
    int(np.argmax([w[0] for w in want])) == d["answer"] for want, d in zip(want_mc, MC_DOCS)
  ]
  assert scores["rove_mc"]["acc,none"] == pytest.approx(np.mean(correct))
  words = sum(len(re.split(r"\s+", d["text"])) for d in ROLLING_DOCS)  # lm_eval's word count
  assert scores["rove_ppl"]["word_perplexity,none"] == pytest.approx(
    np.exp(-sum(want_rolling) / words), rel=RTOL
  )


# ------------------------------------------------------------------------ dependencies


def _requirements(requirements, extras, seen):
  """The distribution names `requirements` pull in (with `extras` active), recursively through
  the installed distributions' metadata; rove_jax's own extras are followed in pyproject.toml."""
  from packaging.requirements import Requirement

  out = set()
  for text in requirements:
    req = Requirement(text)
    if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
      continue
    name = re.sub(r"[-_.]+", "-", req.name).lower()
    key = (name, tuple(sorted(req.extras)))
    if key in seen:
      continue
    seen.add(key)
    out.add(name)
    if name == "rove-jax":
      out |= _requirements([r for e in req.extras for r in _pyproject_extra(e)], {""}, seen)
      continue
    try:
      sub = importlib.metadata.requires(req.name) or []
    except importlib.metadata.PackageNotFoundError:
      raise AssertionError(f"{req.name} (required through {text}) is not installed") from None
    out |= _requirements(sub, {"", *req.extras}, seen)
  return out


def _pyproject_extra(name: str) -> list:
  text = (ROOT / "pyproject.toml").read_text()
  body = re.search(rf"^{re.escape(name)} = \[(.*?)\](?:[ \t]*#.*)?$", text, re.M | re.S)
  assert body, f"no extra {name} in pyproject.toml"
  return re.findall(r'"([^"]+)"', re.sub(r"#.*", "", body.group(1)))


def test_neither_torch_nor_transformers_is_a_test_dependency():
  """What `pip install -e .[test]` installs (the declared closure, read from the installed
  distributions' metadata) holds lm_eval and neither torch nor transformers."""
  closure = _requirements(_pyproject_extra("dependencies") + ["rove_jax[test]"], {""}, set())
  assert {"lm-eval", "flax", "safetensors"} <= closure
  assert not closure & {"torch", "transformers"}, sorted(closure)


def test_only_include_path_needs_an_include_path(capsys):
  from rove_jax.cli import harness as harness_cli

  with pytest.raises(SystemExit) as e:
    harness_cli.parse_args(["--model", "rove_jax", "--tasks", "rove_mc", "--only_include_path"])
  assert e.value.code == 2
  assert "--only_include_path needs --include_path DIR" in capsys.readouterr().err
  args = harness_cli.parse_args(
    ["--model", "rove_jax", "--tasks", "rove_mc", "--include_path", "tasks", "--only_include_path"]
  )
  assert args.only_include_path and args.include_path == "tasks"
