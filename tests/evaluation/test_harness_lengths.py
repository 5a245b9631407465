"""The lm-evaluation-harness model "rove_jax" on inputs longer than its max_length, as lm_eval's
own HF model (HFLM) treats them: a loglikelihood context is cut from the left and the whole
continuation kept; a continuation longer than max_length is refused, as HFLM refuses it;
generate_until keeps the context's last max_length - max_gen_toks tokens, with a default
max_gen_toks that fits a model trained at 64 tokens, and a task asking for max_length new
tokens or more is refused, naming the task, before the model runs. rove-lm-eval prints a
refusal as one line, exit 2.

The model is test_harness.py's tiny random RoVE export, trained length 64 (its default
max_length here).
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from lm_eval.api.instance import Instance

from rove_jax.evaluation import harness
from tests.conftest import subprocess_env
from tests.evaluation.test_harness import RTOL, Request, export_dir, loaded, ref  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = "import os\n" * 9 + "import os"  # 99 byte tokens, more than the model's 64
CODE = "def value(self):\n    return self.x + self.y\n"


@pytest.fixture(scope="module")
def short(export_dir):
  """The export at its defaults: max_length its training length, 64."""
  return harness.RoveJaxLM(path=export_dir, batch_size=2)


def instance(kind: str, args: tuple, task: str, doc: int) -> Instance:
  """A request as lm_eval builds it, naming its task and document."""
  return Instance(request_type=kind, doc={}, arguments=args, idx=0, metadata=(task, doc, 1))


def counting(monkeypatch, lm, name: str) -> list:
  """Counts the calls of the adapter's jitted model function `name`."""
  calls, fn = [], getattr(lm, name)
  monkeypatch.setattr(lm, name, lambda *a: calls.append(1) or fn(*a))
  return calls


def test_the_defaults_fit_the_models_length(export_dir, short):
  assert (short.max_length, short.max_gen_toks) == (64, 32)  # half the input: the context's
  long = harness.RoveJaxLM(path=export_dir, max_length=1024)  # rotary: past its training length
  assert long.max_gen_toks == harness.DEFAULT_MAX_GEN_TOKS == 256  # lm_eval's HF model's
  with pytest.raises(
    harness.InputError,
    match="max_gen_toks 64 leaves no room for a context "
    "in max_length 64; give max_gen_toks below 64",
  ):
    harness.RoveJaxLM(path=export_dir, max_gen_toks=64)


def test_a_long_context_is_cut_from_the_left_keeping_the_whole_continuation(short, loaded, ref):
  pairs = [(CONTEXT, CODE[:30]), (CONTEXT, (CODE * 2)[:64])]  # 64: the longest that fits
  got = short.loglikelihood([Request(*p) for p in pairs])
  for (context, continuation), (logp, greedy) in zip(pairs, got):
    ctx, cont = loaded.encode(context), loaded.encode(continuation)
    assert ctx.size + cont.size > short.max_length + 1
    want_logp, want_greedy = ref.window(np.concatenate([ctx, cont])[-(short.max_length + 1) :])
    np.testing.assert_allclose(logp, want_logp[-cont.size :].sum(), rtol=RTOL)
    assert greedy == bool(want_greedy[-cont.size :].all())


def test_a_continuation_longer_than_max_length_is_refused_before_the_model_runs(short, monkeypatch):
  calls = counting(monkeypatch, short, "_score")
  requests = [
    instance("loglikelihood", ("x = ", "1"), "rove_ok", 0),
    instance("loglikelihood", ("def f(x):", (CODE * 2)[:65]), "rove_long", 3),
  ]
  with pytest.raises(harness.InputError) as e:
    short.loglikelihood(requests)
  assert str(e.value) == (
    "task rove_long (document 3): a continuation of 65 tokens (after 9 of context) is longer "
    "than max_length 64: only the context is cut to fit, as in lm_eval's HF model, which "
    "refuses it too; give model_args max_length=65 or more"
  )
  assert not calls


def test_generate_until_keeps_the_last_tokens_that_leave_room_to_generate(short, loaded):
  prompt = CONTEXT + CODE  # 144 tokens
  got = short.generate_until(
    [Request(prompt, {"until": []}), Request(prompt, {"until": [], "max_gen_toks": 63})]
  )
  # the default 32 new tokens after the last 32 of the prompt; 63 after the last one
  assert got == [loaded.generate(prompt[-32:], 32), loaded.generate(prompt[-1:], 63)]
  assert [len(t) for t in got] == [32, 63]  # ASCII: one character a token, no end-of-text


def test_a_task_asking_max_length_new_tokens_is_refused_before_the_model_runs(short, monkeypatch):
  calls = counting(monkeypatch, short, "_next_ids")
  requests = [
    instance("generate_until", ("x = ", {"until": ["\n"]}), "rove_ok", 0),
    instance("generate_until", ("x = ", {"until": ["\n"], "max_gen_toks": 256}), "rove_gen", 1),
  ]
  with pytest.raises(harness.InputError) as e:
    short.generate_until(requests)
  assert str(e.value) == (
    "task rove_gen (document 1): max_gen_toks 256 leaves no room for a context in max_length "
    "64; give --gen_kwargs max_gen_toks=N with N below 64 (the context keeps its last 64 - N "
    "tokens)"
  )
  assert not calls


def test_sampling_is_refused_naming_the_task(short):
  with pytest.raises(
    harness.InputError,
    match=r"task rove_gen \(document 0\): rove_jax's "
    r"generate_until is greedy only",
  ):
    short.generate_until([instance("generate_until", ("x", {"do_sample": True}), "rove_gen", 0)])


# ---------------------------------------------------------------------------- command


def write_task(directory: Path, name: str, docs: list, body: str) -> None:
  directory.mkdir(exist_ok=True)
  (directory / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
  (directory / f"{name}.yaml").write_text(
    f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
    f"    test: {directory / name}.jsonl\ntest_split: test\n{body}"
  )


def run_command(tmp_path, export_dir, task: str) -> subprocess.CompletedProcess:
  env = subprocess_env(
    HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(ROOT)
  )
  return subprocess.run(
    [
      sys.executable,
      "-m",
      "rove_jax.cli.harness",
      "--model",
      "rove_jax",
      "--model_args",
      f"path={export_dir}",
      "--tasks",
      task,
      "--include_path",
      str(tmp_path / "tasks"),
      "--only_include_path",
      "--log_samples",
      "--output_path",
      str(tmp_path / "out"),
    ],
    env=env,
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
  )


@pytest.mark.slow
def test_the_command_generates_on_a_64_token_model_and_refuses_in_one_line(
  export_dir, loaded, tmp_path
):
  """rove-lm-eval at the export's own length: a generate_until task that sets no max_gen_toks
  runs (exit 0) to the export's greedy text; a multiple-choice task with a choice longer than
  max_length ends in one line naming the task, exit 2."""
  write_task(
    tmp_path / "tasks",
    "rove_gen",
    [{"question": CONTEXT + "def f(x):", "answer": "x"}],
    'output_type: generate_until\ndoc_to_text: "{{question}}"\n'
    'doc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["@@"]\n'
    "metric_list:\n  - metric: exact_match\n",
  )
  write_task(
    tmp_path / "tasks",
    "rove_long",
    [{"question": "def f(x):", "choices": [" y", (CODE * 2)[:70]], "answer": 0}],
    'output_type: multiple_choice\ndoc_to_text: "{{question}}"\n'
    'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
    "metric_list:\n  - metric: acc\n",
  )
  done = run_command(tmp_path, export_dir, "rove_gen")
  assert done.returncode == 0, done.stderr[-5000:]
  (samples,) = (tmp_path / "out").glob("*/samples_rove_gen_*.jsonl")
  sample = json.loads(samples.read_text())
  prompt = CONTEXT + "def f(x):"
  assert sample["resps"] == [[loaded.generate(prompt[-32:], 32)]]

  done = run_command(tmp_path, export_dir, "rove_long")
  assert done.returncode == 2, done.stderr[-5000:]
  assert "Traceback" not in done.stderr
  assert done.stderr.strip().splitlines()[-1] == (
    "rove-lm-eval: error: task rove_long (document 0): a continuation of 71 tokens (after 9 "
    "of context) is longer than max_length 64: only the context is cut to fit, as in "
    "lm_eval's HF model, which refuses it too; give model_args max_length=71 or more"
  )
