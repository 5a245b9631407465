"""Evaluation: scoring, perplexity protocol, report schema, and rove-eval end to end (its module
run as a child process from the checkout, as the installed command runs it)."""

import json
import math
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rove_jax.data import tokenization
from rove_jax.evaluation import perplexity, report, report_files, report_md, scoring
from rove_jax.nn import model as nn_model
from rove_jax.nn.model import GPT
from rove_jax.train import overrides
from rove_jax.train.run_config import RunConfig
from tests.conftest import gpt_config, small_config, subprocess_env
from tests.train.test_loop import ROOT, run_train

ENV1 = subprocess_env(devices=1)


def make_run(cfg, params=None, seed=0):
  model = GPT(cfg, rngs=nnx.Rngs(seed))
  state = nnx.state(model, nnx.Param) if params is None else params
  return scoring.Run(
    workdir="/nonexistent",
    name="t",
    step=0,
    config=RunConfig(model=cfg),
    params=state,
    tokenizer=tokenization.get_tokenizer("bytes"),
  )


def test_uniform_logits_give_perplexity_equal_to_vocab_size():
  cfg = gpt_config()
  zeros = jax.tree.map(jnp.zeros_like, nnx.state(GPT(cfg, rngs=nnx.Rngs(0)), nnx.Param))
  scorer = scoring.Scorer(make_run(cfg, zeros), chunk_size=16)
  tokens = np.random.default_rng(0).integers(0, 257, 2000)
  out = perplexity.evaluate(scorer, tokens, [32, 128], yarn="both", max_tokens=500, progress=False)
  for setting in ("none", "yarn"):
    for L in ("32", "128"):
      np.testing.assert_allclose(out[setting][L]["ppl"], 320, rtol=1e-5)
      assert out[setting][L]["tokens"] >= 500


@pytest.mark.parametrize("stride", [None, 8, 13])
def test_windows_cover_every_token_once(stride):
  tokens = np.arange(200)
  L = 16
  wins, first = perplexity.windows(tokens, L, stride=stride)
  targets = []
  for w, f in zip(wins, first):
    targets += list(w[1:][f:])
  covered = np.array(targets)
  assert len(set(targets)) == len(targets)  # once
  np.testing.assert_array_equal(covered, np.arange(1, covered.max() + 1))  # every token
  assert covered.max() >= 200 - L  # up to (nearly) the end of the stream
  capped, _ = perplexity.windows(tokens, L, max_targets=40)
  assert len(capped) == 3  # 16 + 16 + 16 >= 40 targets


def test_scores_match_a_direct_forward_and_yarn_at_1x_is_identity():
  cfg = gpt_config(pos_encoding="rove")
  run = make_run(cfg, seed=3)
  scorer = scoring.Scorer(run, chunk_size=8)
  toks = np.random.default_rng(1).integers(0, 257, (2, 33)).astype(np.int32)
  nll, match = scorer.token_nll(toks)
  model = GPT(cfg, rngs=nnx.Rngs(3))
  logp = jax.nn.log_softmax(model(toks[:, :-1]), -1)
  want = -np.take_along_axis(np.asarray(logp), toks[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(nll, want, atol=1e-5)
  np.testing.assert_array_equal(match, np.asarray(jnp.argmax(logp, -1)) == toks[:, 1:])
  assert scorer.yarn_scaling(32) is None  # at the training length YaRN is not applied
  yarn1 = {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 32}
  np.testing.assert_allclose(scorer.token_nll(toks, yarn1)[0], nll, atol=1e-6)
  # the (nll, exact match) scorer on a hand-built prompt/answer pair
  prompt, answer = toks[0, :20], toks[0, 20:25]
  ((got_nll, got_em),) = scorer.score([prompt], [answer])
  np.testing.assert_allclose(got_nll, want[0, 19:24].mean(), atol=1e-5)
  assert got_em == bool(np.all(np.asarray(jnp.argmax(logp, -1))[0, 19:24] == answer))


def test_learned_positions_cannot_be_scored_past_their_table():
  scorer = scoring.Scorer(make_run(gpt_config(pos_encoding="learned")))
  with pytest.raises(ValueError, match="learned position embeddings for 32 positions"):
    perplexity.evaluate(scorer, np.arange(500) % 250, [32, 64], progress=False)
  out = perplexity.evaluate(
    scorer, np.arange(500) % 250, [32], yarn="all", max_tokens=64, progress=False
  )
  assert out["none"]["32"]["windows"] == 2
  for setting in ("yarn", "yarn_fixed"):  # nothing rotary to rescale
    assert "no rotary frequencies" in out[setting]["not_applicable"]
  ((nll, _),) = scorer.score([np.arange(20)], [np.arange(20, 25)])  # padded within the table
  assert np.isfinite(nll)


def test_the_fixed_yarn_factor():
  assert perplexity.fixed_factor([16, 32, 512], 32) == 16.0  # max(lengths) / train_len
  assert perplexity.fixed_factor([16, 32], 32, 8) == 8.0  # given
  assert perplexity.fixed_factor([16, 32], 32) is None  # nothing past the training length
  assert scoring.fixed_yarn_scaling(16, 32).to_dict() == {
    "rope_type": "yarn",
    "factor": 16.0,
    "original_max_position_embeddings": 32,
  }
  for bad in (1, 0.5, float("inf"), True):
    with pytest.raises(ValueError, match="finite number > 1"):
      scoring.fixed_yarn_scaling(bad, 32)


def test_exact_match_needs_every_answer_token_to_be_greedy(trained_run):
  """Scorer.score's exact match is all() over the answer tokens: of two-token answers, only the
  one whose both tokens are the greedy continuation matches (not any(), first or last only)."""
  run = scoring.load_run(str(trained_run))
  scorer = scoring.Scorer(run, chunk_size=64)
  model = nn_model.build(run.model_config, run.params)

  def greedy_next(seq):  # the argmax after seq and its margin over the runner-up
    logits = np.asarray(model(jnp.asarray(seq, jnp.int32)[None]))[0, -1]
    runner_up, best = np.sort(logits)[-2:]
    return int(np.argmax(logits)), float(best - runner_up)

  rng = np.random.default_rng(0)
  for _ in range(20):  # a prompt whose greedy choices are not near-ties between kernels
    prompt = rng.integers(0, 256, 20)
    first, m1 = greedy_next(prompt)
    second, m2 = greedy_next(np.append(prompt, first))
    not_first = (first + 1) % 256
    second_after_miss, m3 = greedy_next(np.append(prompt, not_first))
    if min(m1, m2, m3) > 1e-3:
      break
  answers = {
    "both greedy": ([first, second], True),
    "first only": ([first, (second + 1) % 256], False),
    "second only": ([not_first, second_after_miss], False),
  }
  got = scorer.score([prompt] * 3, [np.array(a) for a, _ in answers.values()])
  assert {k: em for k, (_, em) in zip(answers, got)} == {
    k: want for k, (_, want) in answers.items()
  }


def ppl_row(loss, tokens=10, windows=2):
  """A perplexity row with its per-window records (report schema v2)."""
  share = [tokens // windows + (i < tokens % windows) for i in range(windows)]
  return {
    "loss": loss,
    "ppl": math.exp(loss),
    "tokens": tokens,
    "windows": windows,
    "window_nll": [loss * n for n in share],
    "window_tokens": share,
  }


def ruler_row(sample_nll, sample_correct):
  return {
    "nll": float(np.mean(sample_nll)),
    "exact_match": float(np.mean(sample_correct)),
    "n": len(sample_nll),
    "correct": sum(sample_correct),
    "sample_nll": sample_nll,
    "sample_correct": sample_correct,
  }


def _valid_report():
  return {
    "schema_version": report.SCHEMA_VERSION,
    "suite": "quick",
    "runs": [
      {
        "name": "a",
        "workdir": "/x",
        "step": 3,
        "model": {
          "pos_encoding": "rove",
          "params": 10,
          "n_layer": 1,
          "d_model": 8,
          "n_head": 2,
          "max_len": 16,
          "train_len": 16,
        },
        "perplexity": {
          "protocol": {
            "mode": "non-overlapping",
            "max_tokens": 10,
            "train_len": 16,
            "yarn_fixed_factor": 4.0,
          },
          "none": {"8": ppl_row(1.5), "16": ppl_row(1.0)},
          "yarn": {"8": ppl_row(1.5), "16": ppl_row(1.0)},
          "yarn_fixed": {"8": ppl_row(1.7), "16": ppl_row(1.2)},
        },
        "ruler": {
          "protocol": {"samples": 2, "seed": 0, "lengths": [32, 64], "train_len": 16},
          "settings": {
            "none": {
              "tasks": {
                "vt": {"32": ruler_row([2.0, 3.0], [1, 0]), "64": ruler_row([2.0, 2.0], [1, 0])},
                "cwe": {"64": ruler_row([4.0, 5.0], [0, 0])},
              }
            },
            "yarn": {
              "tasks": {
                "vt": {"32": ruler_row([1.0, 2.0], [1, 1]), "64": ruler_row([1.0, 1.0], [0, 1])},
                "cwe": {"64": ruler_row([3.0, 5.0], [0, 1])},
              }
            },
          },
          "skipped": {"cwe@32": "length=32 is too short for task 'cwe'"},
        },
        "icl": {
          "protocol": {
            "context": 16,
            "lengths": [16],
            "samples": 2,
            "shots": [0, 2],
            "seed": 0,
            "rule": "cut from the left",
          },
          "synthetic": {
            "tasks": {
              "x": {
                "by_length": {"16": 0.5},
                "accuracy": 0.5,
                "n": 2,
                "correct": 1,
                "prompts": 2,
                "truncated": 0,
              },
              "y": {
                "by_shots": {"0": 0.0, "2": 0.5},
                "accuracy": 0.25,
                "n": 4,
                "correct": 1,
                "prompts": 4,
                "truncated": 3,
              },
            },
            "skipped": {},
            "accuracy": 0.375,
            "prompts": 6,
            "truncated": 3,
          },
          "files": None,
        },
        "seconds": {},
      }
    ],
  }


def test_report_schema_validation(tmp_path):
  good = _valid_report()
  report.validate(good)
  paths = report_files.write(good, str(tmp_path))
  assert json.loads(open(paths["json"]).read()) == good
  assert "| a | - | 4.48 | 2.72 |" in open(paths["md"]).read()
  ruler_none = ("runs", 0, "ruler", "settings", "none", "tasks", "vt", "32")
  for bad_path, value, msg in [
    (("runs", 0, "perplexity", "none", "16", "ppl"), float("nan"), "finite"),
    (("runs", 0, "perplexity", "yarn_fixed", "16", "window_tokens"), [5, 4], "sum to tokens"),
    (("runs", 0, "perplexity", "none", "16", "window_nll"), [5.0, 6.0], "is not the loss"),
    (("runs", 0, "perplexity", "yarn", "8", "window_nll"), [15.0], "one entry a window"),
    (ruler_none + ("exact_match",), 1.5, r"\[0, 1\]"),
    (ruler_none + ("sample_nll",), [2.0], "need n=2 entries"),
    (ruler_none + ("sample_correct",), [1, 2], "sample_correct of 0 or 1"),
    (ruler_none + ("correct",), 2, r"sum\(sample_correct\)"),
    (("runs", 0, "ruler", "settings", "yarn_fixed"), {"tasks": {}}, "settings are"),
    (("runs", 0, "model", "params"), "10", "must be"),
  ]:
    broken = json.loads(json.dumps(good))
    node = broken
    for key in bad_path[:-1]:
      node = node[key]
    node[bad_path[-1]] = value
    with pytest.raises(ValueError, match=msg):
      report.validate(broken)


def test_version_1_reports_are_refused_by_validate_and_still_rendered():
  assert report.SCHEMA_VERSION == 2
  old = {
    "schema_version": 1,
    "suite": "quick",
    "runs": [
      {
        **_valid_report()["runs"][0],
        "ruler": {
          "tasks": {"vt": {"64": {"nll": 2.0, "exact_match": 0.5, "n": 2}}},
          "skipped": {},
          "yarn": True,
        },
      }
    ],
  }
  with pytest.raises(
    ValueError, match="schema_version 1 is the layout before per-window.*rerun rove-eval"
  ):
    report.validate(old)
  with pytest.raises(ValueError, match="schema_version must be 2, got 3"):
    report.validate({**old, "schema_version": 3})
  md = report_md.markdown(old)
  assert "### +YaRN" in md and "| a | 2.00, 1/2 | 2.00 | 1/2 |" in md


def test_markdown_shows_every_setting_and_counts_with_exact_captions():
  md = report_md.markdown(_valid_report())
  assert "| run | YaRN | 8 | 16 |" in md
  assert "| a | +YaRN fixed s=4 | 5.47 | 3.32 |" in md  # exp(1.7), exp(1.2)
  assert "+YaRN fixed: one factor s = 4 at every length, those <= 16 included" in md
  assert md.index("### No YaRN") < md.index("### +YaRN")
  # Per length: "NLL, exact matches / samples" per task, the mean over the tasks scored there.
  assert "| run | cwe | vt | mean NLL | exact match |" in md
  assert "| a | - | 2.50, 1/2 | 2.50 | 1/2 |" in md  # no YaRN at 32: cwe was skipped
  assert "| a | 4.50, 0/2 | 2.00, 1/2 | 3.25 | 1/4 |" in md  # no YaRN at 64
  # Per task over lengths: the caption names the task scored at fewer lengths.
  assert (
    "averaged over the lengths it was scored at: 32, 64 tokens for every task except "
    "cwe (64 only), skipped at the other lengths"
  ) in md
  assert "| a | 4.50, 0/2 | 2.25, 2/4 | 3.38 |" in md
  assert "- cwe@32: skipped (length=32 is too short" in md
  # ICL: counts, pooled over the tasks, and the prompts cut to the context.
  assert "| run | x | y | all | cut |" in md and "| a | 1/2 | 1/4 | 2/6 | 3/6 |" in md
  assert "Protocol: cut from the left. By-length tasks at 16 tokens" in md
  assert "%" not in md  # floor metrics are never relative percentages


def test_missing_workdir_or_checkpoint_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match="does not exist"):
    scoring.load_run(str(tmp_path / "nope"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="no checkpoints"):
    scoring.load_run(str(tmp_path / "empty"))
  r = subprocess.run(
    [sys.executable, "-m", "rove_jax.cli.eval", "--workdir", str(tmp_path / "nope")],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
    env=ENV1,
  )
  assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.slow
def test_rove_eval_end_to_end_on_a_trained_checkpoint(tmp_path, trained_run):
  c = small_config(
    tmp_path,
    **{
      "data.source": "stdlib",
      "data.path": None,
      "data.max_files": 120,
      "model.max_len": 64,
      "data.seq_len": 64,
      "steps": 6,
    },
  )
  shutil.copytree(trained_run, tmp_path / "run")  # this config, trained once per session
  run_train(
    overrides.apply(c, {"model.pos_encoding": "rope"}), tmp_path / "rope", log=lambda *a: None
  )
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "rove_jax.cli.eval",
      "--workdir",
      str(tmp_path / "run"),
      "--compare",
      str(tmp_path / "rope"),
      "--suite",
      "quick",
      "--lengths",
      "64,128",
      "--no-progress",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    env=ENV1,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  out = tmp_path / "run" / "eval"
  rep = json.loads((out / "report.json").read_text())
  report.validate(rep)
  run = rep["runs"][0]
  assert run["step"] == 6 and run["model"]["pos_encoding"] == "rove"
  assert set(run["perplexity"]["none"]) == set(run["perplexity"]["yarn"]) == {"64", "128"}
  assert all(1 < row["ppl"] < 400 for row in run["perplexity"]["none"].values())
  assert set(run["ruler"]["settings"]) == {"none", "yarn"}  # --yarn both: RULER under both
  assert run["ruler"]["settings"]["none"]["tasks"] and run["icl"]["synthetic"]["tasks"]
  assert run["icl"]["protocol"]["lengths"] == [64]  # ICL inside the training context
  for name in (
    "report.md",
    "perplexity_vs_length.png",
    "ruler_nll.png",
    "icl_accuracy.png",
    "figure1_mixer.png",
  ):
    assert (out / name).stat().st_size > 0, name
  md = (out / "report.md").read_text()
  assert "| run | YaRN | 64 | 128 |" in md
  assert [r["name"] for r in rep["runs"]] == ["run", "rope"]  # --compare: one table, both runs
  assert rep["runs"][1]["model"]["pos_encoding"] == "rope" and "| rope | +YaRN |" in md
