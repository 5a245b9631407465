"""In-context learning: LLM-Foundry / DCLM task files and download-free synthetic tasks.

Everything here talks to the model through one function and is pure Python + numpy:

  score_fn(prompts, continuations) -> [(mean_nll, greedy_match), ...]

prompts[i] and continuations[i] are int32 token ids; mean_nll is the teacher-forced mean negative
log-likelihood of the continuation tokens given the prompt, greedy_match is True when the argmax
prediction at every continuation position equals the continuation token. Every prompt starts with
tokenizer.eot_id: the training data puts eot after every document, so this is what the start of a
document looks like to the model, and a prompt is never empty.

This module gathers the public names of:
  icl_specs      TaskSpec and the spec files that list the task files to evaluate
  icl_files      the task files (multiple_choice, language_modeling, schema): prompts with
                 shots, `run_task_files`, centered accuracy and DCLM's Core score
  icl_synthetic  synthetic tasks by length (associative_recall, passkey, induction, flip_flop,
                 dyck) and by number of shots (fewshot_*): `synthetic_examples`, `run_synthetic`
  prompting      what ICL shares with RULER: the tokenizer protocol, encoding, length fitting,
                 answer scoring
"""

from rove_jax.evaluation.icl.files import (
  build_prompts,
  centered_accuracy,
  core_score,
  fewshot_indices,
  read_task_file,
  run_task_files,
)
from rove_jax.evaluation.icl.specs import KINDS, SCORINGS, TaskSpec, load_specs, load_task_specs
from rove_jax.evaluation.icl.synthetic import (
  FEWSHOT_TASKS,
  LENGTH_TASKS,
  LENGTH_TOLERANCE,
  run_synthetic,
  synthetic_examples,
  synthetic_tasks,
)
from rove_jax.evaluation.prompting import ScoreFn, Tokenizer, encode_prompt

__all__ = [
  "KINDS",
  "SCORINGS",
  "TaskSpec",
  "load_task_specs",
  "load_specs",
  "read_task_file",
  "fewshot_indices",
  "build_prompts",
  "run_task_files",
  "centered_accuracy",
  "core_score",
  "LENGTH_TASKS",
  "FEWSHOT_TASKS",
  "LENGTH_TOLERANCE",
  "synthetic_tasks",
  "synthetic_examples",
  "run_synthetic",
  "ScoreFn",
  "Tokenizer",
  "encode_prompt",
]
