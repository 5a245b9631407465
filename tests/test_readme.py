"""Every command in README.md is exercised by a test or by `make demo`.

This file extracts every shell command from README.md (indented and non-python fenced code
blocks, with backslash continuations joined and trailing `# comments` dropped, plus inline
backticks that start with `python `, `make ` or `pip `) and checks each one by kind:

  make X              X is a Makefile target; `make -n -B X` (a dry run: nothing is built)
                      succeeds and shows the underlying command (train.py / pytest /
                      reproduce.py); the python and pip commands it would run are checked like
                      README commands, and `make demo` evaluates the workdir it trains.
  python train.py     absl parses the exact argv the way train.py does, the config file loads
                      with the overrides and rove_jax.config.validate accepts it. Nothing is
                      trained here: tests/test_training.py runs train.py end to end.
  python -m eval      eval.__main__.parse_args accepts it (tests/test_eval.py runs it).
  python -m bench[.X] the module's own argparse parser accepts it and `--help` works
                      (tests/test_bench.py runs the suite).
  python reproduce.py reproduce.parse_args accepts it.
  pip install         the extras exist in pyproject.toml; `git+<this repository>` is accepted.
  bash F              F exists and `bash -n F` passes.
  srun / gcloud       cannot run here: the README must say so, and the train.py command inside
                      them parses like any other (`...` means "the same flags": the preceding
                      train.py command's, less the multi-process flags SLURM makes optional).

Usage synopses (`[--flag value]`, `a|b`, `...`) are flag documentation: every `--flag` must be
an exact option of the real parser (no argparse abbreviations), every listed choice must be
accepted, and a bracketed synopsis expanded with all of its options must parse. Anything else
fails with "README command not covered". All parsing that imports JAX runs in ONE subprocess
with a clean environment (conftest.py gives this process 8 fake devices).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

try:
  import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.10
  tomllib = None

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# A code-block line is a command iff it starts with one of these.
PREFIXES = ("make ", "python ", "python3 ", "pip ", "bash ", "srun ", "gcloud ", ".venv/bin/")
INLINE_PREFIXES = ("make ", "python ", "python3 ", "pip ")
SHELL_FENCES = ("bash", "sh", "shell", "console", "zsh")
# Shell variables in the README's cluster commands, given dummy values for parsing.
SHELL_VARS = {"RANK": "0", "TPU": "my-tpu", "ZONE": "us-central2-b", "BUCKET": "my-bucket"}
# train.py's multi-process flags: optional under SLURM and on TPU pods.
DISTRIBUTED_FLAGS = ("--coordinator_address", "--num_processes", "--process_id")
# What each Makefile target the README names must run (seen in its dry run).
MAKE_EXPECTS = {"demo": ["-m venv", "train.py", "-m eval"],
                "test": ["-m venv", ".[test]", "-m pytest"],
                "reproduce": ["reproduce.py"]}
# Inline mentions of the override syntax itself, not of a field.
GENERIC_CONFIG_FLAGS = ("--config.field=value", "--config.x=y")
PIP_OPTIONS = ("-e", "--editable", "-U", "--upgrade", "-q", "--quiet")  # the install options used
PIP_PLACEHOLDER = "git+<this repository>"
PIP_PLACEHOLDER_TOKEN = "git+THIS-REPOSITORY"
# Kinds that have a check; anything else is "uncovered".
CHECKED_KINDS = ("make", "train", "eval", "bench", "reproduce", "pip", "bash", "srun", "gcloud")


# ----------------------------------------------------------------------------- extraction


@dataclasses.dataclass(frozen=True)
class Command:
  text: str  # continuation lines joined, comment dropped, whitespace normalised
  line: int  # 1-based line of README.md where it starts
  end_line: int
  inline: bool = False
  section: str = ""

  @property
  def id(self) -> str:
    text = self.text if len(self.text) <= 70 else self.text[:67] + "..."
    return f"L{self.line}:{text}"


def strip_comment(s: str) -> str:
  """Drops a trailing `# comment` the way a shell does: `#` starting a word, outside quotes."""
  quote, i, prev = None, 0, " "
  while i < len(s):
    ch = s[i]
    if quote:
      if ch == "\\" and quote == '"':
        i += 1
      elif ch == quote:
        quote = None
    elif ch == "\\":
      i += 1
    elif ch in "'\"":
      quote = ch
    elif ch == "#" and prev.isspace():
      return s[:i].rstrip()
    prev = ch
    i += 1
  return s.rstrip()


def _code_blocks(lines):
  """(first line index, lines, lang) of each fenced or indented code block; lang is None for
  indented blocks."""
  blocks, i = [], 0
  while i < len(lines):
    line = lines[i]
    fence = re.match(r"^\s{0,3}(```+|~~~+)\s*([\w+-]*)", line)
    if fence:
      marker, lang, j = fence.group(1), fence.group(2).lower(), i + 1
      while j < len(lines) and not lines[j].lstrip().startswith(marker):
        j += 1
      blocks.append((i + 1, lines[i + 1:j], lang))
      i = j + 1
      continue
    if (line.startswith("    ") or line.startswith("\t")) and line.strip() and (
        i == 0 or not lines[i - 1].strip()):
      j = i
      while j < len(lines) and (not lines[j].strip() or lines[j].startswith("    ")
                                or lines[j].startswith("\t")):
        j += 1
      while j > i and not lines[j - 1].strip():
        j -= 1
      blocks.append((i, [l[4:] if l.startswith("    ") else l[1:] for l in lines[i:j]], None))
      i = j
      continue
    i += 1
  return blocks


def _block_commands(start, block, lang):
  # Join backslash continuations (bash drops backslash-newline, also inside double quotes).
  logical, buf, first = [], None, 0
  for off, line in enumerate(block):
    if buf is None:
      buf, first = line, off
    else:
      buf += line
    if buf.rstrip().endswith("\\") and not strip_comment(buf).rstrip().endswith("#"):
      buf = buf.rstrip()[:-1]
      continue
    logical.append((first, off, strip_comment(buf)))
    buf = None
  if buf is not None:
    logical.append((first, len(block) - 1, strip_comment(buf)))

  nonempty = [text.strip() for _, _, text in logical if text.strip()]
  if lang is not None and lang in SHELL_FENCES:
    shell = True
  else:  # an indented or untyped block is a shell block iff it opens with a command
    shell = bool(nonempty) and nonempty[0].startswith(PREFIXES)

  out, cur = [], None  # cur: [start, end, indent, text]
  for first, last, text in logical:
    stripped = " ".join(text.split())
    if not stripped:
      continue
    indent = len(text) - len(text.lstrip())
    if not shell:  # a diagram or listing: only lines that start like a command, arrows cut
      if stripped.startswith(PREFIXES):
        out.append([first, last, indent, stripped.split(" -> ")[0].strip()])
      continue
    if stripped.startswith(PREFIXES):
      cur = [first, last, indent, stripped]
      out.append(cur)
    elif cur is not None and indent > cur[2]:  # a wrapped usage synopsis
      cur[1], cur[3] = last, cur[3] + " " + stripped
    else:  # a shell line that is none of the known commands
      cur = None
      out.append([first, last, indent, stripped])
  return [Command(text, start + f + 1, start + l + 1) for f, l, _, text in out]


def extract(markdown: str):
  """(commands, inline_flags): every command of the README in order, deduplicated by text
  (a code-block occurrence wins over an inline one), and the inline `--flag` mentions."""
  lines = markdown.split("\n")
  commands, code_lines = [], set()
  for start, block, lang in _code_blocks(lines):
    first = start if lang is None else start - 1
    code_lines.update(range(first, start + len(block) + (0 if lang is None else 1)))
    if lang in ("python", "py", "pycon", "json", "toml", "yaml"):
      continue
    commands += _block_commands(start, block, lang)

  prose = "\n".join("" if i in code_lines else l for i, l in enumerate(lines))
  headings = [(m.start(), m.group(1).strip()) for m in re.finditer(r"^#+ (.*)$", prose, re.M)]
  inline, flags = [], []
  for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
    text = " ".join(m.group(1).split())
    line = prose.count("\n", 0, m.start()) + 1
    section = next((h for pos, h in reversed(headings) if pos < m.start()), "")
    if text.startswith(INLINE_PREFIXES):
      inline.append(Command(text, line, line, inline=True, section=section))
    elif text.startswith("--"):
      flags.append(Command(text, line, line, inline=True, section=section))

  seen, unique = set(), []
  for cmd in commands + inline:
    if cmd.text not in seen:
      seen.add(cmd.text)
      unique.append(cmd)
  fseen, uflags = set(), []
  for f in flags:
    if (f.text, f.section) not in fseen:
      fseen.add((f.text, f.section))
      uflags.append(f)
  return unique, uflags


# ----------------------------------------------------------------------------- classification


def substitute(text: str):
  """$VAR -> dummy value; returns (text, unknown variable names)."""
  unknown = []

  def sub(m):
    name = m.group(1) or m.group(2)
    if name not in SHELL_VARS:
      unknown.append(name)
      return m.group(0)
    return SHELL_VARS[name]

  return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, text), unknown


def tokenize(text: str):
  text, unknown = substitute(text)
  tokens = shlex.split(text)
  if tokens and tokens[0].startswith(".venv/bin/"):
    tokens[0] = tokens[0][len(".venv/bin/"):]
  if tokens[:3] in (["python", "-m", "pip"], ["python3", "-m", "pip"]):
    tokens = ["pip"] + tokens[3:]
  return tokens, unknown


def kind_of(tokens) -> str:
  if not tokens:
    return "uncovered"
  head = tokens[0]
  if head in ("make", "pip", "bash", "srun", "gcloud"):
    return head
  if head in ("python", "python3") and len(tokens) > 1:
    if tokens[1] == "-m" and len(tokens) > 2:
      module = tokens[2]
      if module == "eval":
        return "eval"
      if module == "bench" or module.startswith("bench."):
        return "bench"
      return "uncovered"
    return {"train.py": "train", "reproduce.py": "reproduce"}.get(tokens[1], "uncovered")
  return "uncovered"


def kind(cmd: Command) -> str:
  try:
    return kind_of(tokenize(cmd.text)[0])
  except ValueError:
    return "uncovered"


def mode_of(tokens, inline: bool) -> str:
  """exact: run as written; synopsis: `[...]` usage; reference: flags named, values elided."""
  if inline:
    return "reference"
  if any(t.startswith("[") for t in tokens):
    return "synopsis"
  if any(t == "..." or "|" in t or re.search(r"<[^>]*>", t) for t in tokens):
    return "reference"
  return "exact"


# ----------------------------------------------------------------------------- local checks


def clean_env() -> dict:
  """The machine as it is, one CPU device (conftest.py gives this process 8 fake ones)."""
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if "xla_force_host_platform_device_count" not in f]
  env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=1"])
  env["JAX_PLATFORMS"] = "cpu"
  return env


@functools.lru_cache(maxsize=None)
def make_targets() -> frozenset:
  text = (ROOT / "Makefile").read_text()
  return frozenset(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))


@functools.lru_cache(maxsize=None)
def make_dry_run(args: tuple):
  # -n prints the recipes without running them (the Makefile has no `+` or $(MAKE) lines),
  # so nothing is installed or built; -B prints every recipe whatever .venv's state.
  if re.search(r"^\t[@-]*\+", (ROOT / "Makefile").read_text(), re.M):
    return 1, "the Makefile has `+` recipe lines, which `make -n` would run: not dry-running it"
  p = subprocess.run(["make", "-n", "-B", "--no-print-directory", *args], cwd=ROOT,
                     capture_output=True, text=True, timeout=60)
  return p.returncode, p.stdout + p.stderr


@functools.lru_cache(maxsize=None)
def extras() -> frozenset:
  """The names in pyproject.toml's [project.optional-dependencies]."""
  if tomllib is not None:
    with open(ROOT / "pyproject.toml", "rb") as f:
      return frozenset(tomllib.load(f).get("project", {}).get("optional-dependencies", {}))
  text = (ROOT / "pyproject.toml").read_text()
  m = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
  return frozenset(re.findall(r"^([A-Za-z0-9_.-]+)\s*=", m.group(1), re.M) if m else [])


@functools.lru_cache(maxsize=None)
def help_text(module: str):
  p = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, env=clean_env(),
                     capture_output=True, text=True, timeout=120)
  return p.returncode, p.stdout + p.stderr


def flag_names(tokens):
  out = []
  for t in tokens:
    t = t.strip("[]")
    if t.startswith("-") and t not in ("-", "--"):
      out.append(t.split("=", 1)[0])
  return out


def not_run_here(readme: str, line: int, words) -> bool:
  """The README says, after `line`, that commands of this kind could not be run."""
  lines = readme.split("\n")
  after = " ".join(" ".join(lines[line - 1:]).split())
  for sentence in re.split(r"(?<=[.;])\s", after):
    if re.search(r"could\s+not\s+be\s+run", sentence) and any(w in sentence for w in words):
      return True
  return False


@dataclasses.dataclass
class Plan:
  problems: list
  jobs: list  # checks for the batched subprocess: dicts with "id"


def plan_python(tokens, mode, key, plan: Plan):
  """tokens start with `python`; adds the checks of a train/eval/bench/reproduce command."""
  k = kind_of(tokens)
  if k == "train":
    if not (ROOT / "train.py").is_file():
      plan.problems.append("train.py does not exist")
    argv = tokens[1:]
    if mode == "exact":
      plan.jobs.append({"id": key, "kind": "train", "argv": argv})
    else:
      plan.jobs.append({"id": key, "kind": "train_flags", "flags": flag_names(argv[1:])})
  elif k in ("eval", "reproduce"):
    args = tokens[3:] if k == "eval" else tokens[2:]
    plan.jobs.append({"id": key, "kind": "argparse", "target": k, "args": args, "mode": mode})
  elif k == "bench":
    module, args = tokens[2], tokens[3:]
    path = ROOT / (module.replace(".", "/") + ".py")
    if module == "bench":
      path = ROOT / "bench" / "__main__.py"
    if not path.is_file():
      plan.problems.append(f"{module}: no such module ({path.relative_to(ROOT)})")
      return
    rc, text = help_text(module)
    if rc != 0:
      plan.problems.append(f"`python -m {module} --help` exited {rc}: {text[-2000:]}")
    else:
      for name in flag_names(args):
        if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text):
          plan.problems.append(f"`python -m {module} --help` does not list {name}")
      positional = [t.strip("[]") for t in args[:1] if not t.startswith(("-", "["))]
      for alt in (a for t in positional for a in t.split("|")):
        if not re.search(rf"[{{,]{re.escape(alt)}[}},]", text):
          plan.problems.append(f"`python -m {module} --help` does not offer {alt!r}")
    plan.jobs.append({"id": key, "kind": "argparse", "target": module, "args": args,
                      "mode": mode})
  else:
    plan.problems.append(f"README command not covered: {' '.join(tokens)}")


def pip_problems(tokens) -> list:
  """`pip install` of this package (optionally with extras) or of its placeholder URL."""
  text = " ".join(tokens)
  if tokens[1:2] != ["install"]:
    return [f"README command not covered (pip {tokens[1:2]}): {text}"]
  problems = []
  targets = [t for t in tokens[2:] if not t.startswith("-")]
  bad_opts = [t for t in tokens[2:] if t.startswith("-") and t not in PIP_OPTIONS]
  if bad_opts:
    problems.append(f"pip options not covered: {bad_opts}")
  if not targets:
    problems.append("pip install without a target")
  for target in targets:
    if target == PIP_PLACEHOLDER_TOKEN:
      continue  # the placeholder for this repository's URL
    if target == "pip" and ("-U" in tokens or "--upgrade" in tokens):
      continue  # pip upgrading itself (the Makefile does)
    m = re.fullmatch(r"\.(?:\[([\w,\s-]*)\])?", target)
    if not m:
      problems.append(f"README command not covered (pip target {target!r}): {text}")
      continue
    if not (ROOT / "pyproject.toml").is_file():
      problems.append("pip install .: no pyproject.toml")
    for extra in filter(None, (e.strip() for e in (m.group(1) or "").split(","))):
      if extra not in extras():
        problems.append(f"pip extra {extra!r} is not in pyproject.toml's "
                        f"optional-dependencies {sorted(extras())}")
  return problems


def plan_command(cmd: Command, commands, readme: str) -> Plan:
  plan, key = Plan([], []), cmd.id
  try:  # the "<this repository>" placeholder is one word
    tokens, unknown = tokenize(cmd.text.replace(PIP_PLACEHOLDER, PIP_PLACEHOLDER_TOKEN))
  except ValueError as e:
    return Plan([f"README command not covered (shell syntax: {e}): {cmd.text}"], [])
  if unknown:
    plan.problems.append(f"shell variables without a dummy value in SHELL_VARS: {unknown}")
  k = kind_of(tokens)
  mode = mode_of(tokens, cmd.inline)

  if k == "make":
    assigns = [t for t in tokens[1:] if "=" in t]
    targets = [t for t in tokens[1:] if "=" not in t and not t.startswith("-")]
    if not targets:
      plan.problems.append("`make` without a target")
    for target in targets:
      if target not in make_targets():
        plan.problems.append(f"make {target}: no such target in the Makefile")
        continue
      rc, out = make_dry_run(tuple(assigns + [target]))
      if rc != 0:
        plan.problems.append(f"`make -n {target}` exited {rc}: {out[-2000:]}")
        continue
      for expect in MAKE_EXPECTS.get(target, []):
        if expect not in out:
          plan.problems.append(f"`make -n {target}` does not run `{expect}`:\n{out}")
      workdirs = {}
      for n, line in enumerate(out.splitlines()):
        try:
          sub = shlex.split(line)
        except ValueError:
          continue
        if not sub or not sub[0].endswith(("python", "python3")) or len(sub) < 2:
          continue
        sub = ["python"] + sub[1:]
        sub, _ = tokenize(shlex.join(sub))  # python -m pip -> pip
        sk = kind_of(sub)
        if sk == "pip":  # the Makefile's installs name real extras too
          plan.problems += pip_problems(sub)
        elif sk in ("train", "eval", "reproduce"):
          plan_python(sub, "exact", f"{key}#make-{target}-{n}", plan)
          if "--workdir" in sub[:-1]:
            workdirs[sk] = sub[sub.index("--workdir") + 1]
      if "train" in workdirs and "eval" in workdirs and workdirs["train"] != workdirs["eval"]:
        plan.problems.append(f"make {target} evaluates {workdirs['eval']} but trains "
                             f"{workdirs['train']}")

  elif k in ("train", "eval", "bench", "reproduce"):
    plan_python(tokens, mode, key, plan)

  elif k == "pip":
    plan.problems += pip_problems(tokens)

  elif k == "bash":
    script = ROOT / tokens[1] if len(tokens) > 1 else None
    if script is None or not script.is_file():
      plan.problems.append(f"bash: no such script {tokens[1:2]}")
    else:
      p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
      if p.returncode != 0:
        plan.problems.append(f"`bash -n {tokens[1]}` failed: {p.stderr}")

  elif k == "srun":
    if not not_run_here(readme, cmd.line, ("GPU-cluster", "SLURM", "srun")):
      plan.problems.append("the README does not say the srun command could not be run here")
    py = next((i for i, t in enumerate(tokens) if t in ("python", "python3")), None)
    if py is None:
      plan.problems.append(f"srun without a python command: {cmd.text}")
      return plan
    bad = [t for t in tokens[1:py] if not t.startswith("--")]
    if bad:
      plan.problems.append(f"srun: unexpected arguments before python: {bad}")
    inner = tokens[py:]
    if "..." in inner:  # "the same flags": the preceding train.py command's
      before = [c for c in commands if c.line < cmd.line and not c.inline and kind(c) == "train"]
      if not before:
        plan.problems.append("srun `...` but no train.py command before it to take flags from")
        return plan
      prev = tokenize(before[-1].text)[0][2:]
      same, i = [], 0
      while i < len(prev):
        name = prev[i].split("=", 1)[0]
        if name in DISTRIBUTED_FLAGS:  # SLURM: "the flags can be left out"
          i += 1 if "=" in prev[i] else 2
          continue
        same.append(prev[i])
        i += 1
      at = inner.index("...")
      inner = inner[:at] + same + [t for t in inner[at + 1:] if t != "..."]
    if kind_of(inner) != "train":
      plan.problems.append(f"README command not covered (srun runs {inner[:2]}): {cmd.text}")
      return plan
    plan_python(inner, mode_of(inner, False), key, plan)

  elif k == "gcloud":
    if not not_run_here(readme, cmd.line, ("TPU", "gcloud")):
      plan.problems.append("the README does not say the gcloud command could not be run here")
    remote = None
    for i, t in enumerate(tokens):
      if t.startswith("--command="):
        remote = t.split("=", 1)[1]
      elif t == "--command" and i + 1 < len(tokens):
        remote = tokens[i + 1]
    if remote is None:
      plan.problems.append(f"README command not covered (gcloud without --command): {cmd.text}")
      return plan
    title = re.search(r"^# (\S+)", readme, re.M)
    for part in filter(None, (p.strip() for p in re.split(r"&&|;", remote))):
      sub = shlex.split(part)
      if sub[0] == "cd":
        if title is None or sub[1:] != [title.group(1)]:
          plan.problems.append(f"gcloud: `{part}` is not the checkout (README title "
                               f"{title.group(1) if title else None!r})")
      elif kind_of(sub) == "train":
        plan_python(sub, mode_of(sub, False), key, plan)
      else:
        plan.problems.append(f"README command not covered (gcloud runs `{part}`)")

  else:
    plan.problems.append(f"README command not covered: {cmd.text}")
  return plan


def plan_flag(flag: Command, commands) -> Plan:
  """An inline `--flag` mention: `--config.*` overrides apply to configs/tiny.py and validate;
  other flags in the Evaluation section must be options of python -m eval, and elsewhere of
  python -m eval, python -m bench[.X], reproduce.py or train.py."""
  plan, key, text = Plan([], []), flag.id, flag.text
  if text.startswith("--config."):
    m = re.fullmatch(r"--config\.([\w.]+)((?:\s*/\s*\w+)*)(?:=(.*))?", text)
    if not m:
      plan.problems.append(f"unrecognised config flag mention {text!r}")
      return plan
    path, alts, value = m.group(1), m.group(2), m.group(3)
    if text in GENERIC_CONFIG_FLAGS:
      return plan  # "--config.field=value" and the like: the syntax, not a field
    paths = [path]
    if alts:  # --config.mesh.data / fsdp / tensor
      parent = path.rsplit(".", 1)[0]
      paths += [f"{parent}.{a.strip()}" for a in alts.split("/") if a.strip()]
    for p in paths:
      if value is None:
        plan.jobs.append({"id": f"{key}#{p}", "kind": "config_key", "path": p})
      else:
        v = "1" if value == "N" else value  # N: a number of the reader's choosing
        plan.jobs.append({"id": f"{key}#{p}", "kind": "train",
                          "argv": ["train.py", "--config", "configs/tiny.py", "--workdir",
                                   "runs/readme-check", f"--config.{p}={v}"]})
  elif flag.section.startswith("Evaluation"):
    plan.jobs.append({"id": key, "kind": "argparse", "target": "eval",
                      "args": text.split(), "mode": "reference"})
  else:  # elsewhere: an option of one of the README's programs
    targets = sorted({tokenize(c.text)[0][2] for c in commands if kind(c) in ("eval", "bench")}
                     | {"reproduce"})
    plan.jobs.append({"id": key, "kind": "flag_anywhere", "flag": text.split()[0],
                      "targets": targets})
  return plan


# ----------------------------------------------------------------------------- the subprocess

# Runs in one clean subprocess (cwd = the repository root): imports train.py for its absl
# flags, eval/reproduce/bench for their argparse parsers, and checks every job.
CHECKER = r'''
import argparse, contextlib, importlib, io, json, sys, traceback

JOBS_PATH, RESULTS_PATH = sys.argv[1], sys.argv[2]  # before check_train rewrites sys.argv
jobs = json.load(open(JOBS_PATH))
results = {}

class _Captured(Exception):
  def __init__(self, parser):
    self.parser = parser

def capture_parser(fn):
  """The ArgumentParser fn builds: its parse_args is intercepted, so nothing runs."""
  orig = argparse.ArgumentParser.parse_args
  def fake(self, *a, **k):
    raise _Captured(self)
  argparse.ArgumentParser.parse_args = fake
  try:
    fn([])
  except _Captured as c:
    return c.parser
  finally:
    argparse.ArgumentParser.parse_args = orig
  raise RuntimeError(f"{fn} built no ArgumentParser")

_parsers = {}
def parser_for(target):
  if target not in _parsers:
    if target in ("eval", "reproduce"):
      mod = importlib.import_module("eval.__main__" if target == "eval" else "reproduce")
      _parsers[target] = (mod.parse_args, capture_parser(mod.parse_args))
    else:
      mod = importlib.import_module("bench.__main__" if target == "bench" else target)
      factory = getattr(mod, "parse_args", None) or mod.main
      parser = capture_parser(factory)
      _parsers[target] = (getattr(mod, "parse_args", None) or parser.parse_args, parser)
  return _parsers[target]

def try_parse(fn, argv):
  buf = io.StringIO()
  try:
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
      fn(list(argv))
  except SystemExit as e:
    return f"{argv} rejected (exit {e.code}): {buf.getvalue().strip()[-1500:]}"
  return None

def check_value(action, value):
  if action.type is not None and callable(action.type):
    try:
      value = action.type(value)
    except (TypeError, ValueError) as e:
      return f"{value!r} is not a valid {action.dest} ({e})"
  if action.choices is not None and value not in action.choices:
    return f"{value!r} is not a choice of {action.dest} {list(action.choices)}"
  return None

def synopsis_problems(parser, tokens):
  """Every --flag is an exact option (no abbreviations); every listed value is accepted."""
  problems = []
  options = parser._option_string_actions
  positionals = [a for a in parser._actions if not a.option_strings]
  i = 0
  while i < len(tokens):
    tok = tokens[i].replace("[", "").replace("]", "")
    i += 1
    if not tok or tok == "...":
      continue
    if tok.startswith("-"):
      name, eq, val = tok.partition("=")
      action = options.get(name)
      if action is None:
        problems.append(f"{name} is not an option of {parser.prog}")
        continue
      values = [val] if eq else []
      if not eq and action.nargs != 0:
        many = action.nargs in ("*", "+") or isinstance(action.nargs, int) and action.nargs > 1
        while i < len(tokens) and not tokens[i].startswith(("-", "[")):
          values.append(tokens[i].replace("]", ""))
          i += 1
          if not many:
            break
      for v in values:
        for alt in v.split("|"):
          if alt and alt != "..." and not (alt.startswith("<") and alt.endswith(">")):
            err = check_value(action, alt)
            if err:
              problems.append(f"{name}: {err}")
    else:
      if not positionals:
        problems.append(f"{tok!r}: {parser.prog} takes no positional arguments")
        continue
      action = positionals.pop(0)
      for alt in tok.split("|"):
        err = check_value(action, alt)
        if err:
          problems.append(err)
  return problems

def expansions(tokens):
  """A bracketed synopsis with every option given, once per alternative of a|b."""
  toks = [t.replace("[", "").replace("]", "") for t in tokens]
  toks = [t for t in toks if t and t != "..."]
  n = max((len(t.split("|")) for t in toks), default=1)
  return [[t.split("|")[min(k, len(t.split("|")) - 1)] for t in toks] for k in range(n)]

def check_argparse(job):
  fn, parser = parser_for(job["target"])
  problems = synopsis_problems(parser, job["args"])
  if job["mode"] == "exact":
    variants = [job["args"]]
  elif job["mode"] == "synopsis":
    variants = expansions(job["args"])
  else:
    variants = []
  for argv in variants:
    err = try_parse(fn, argv)
    if err:
      problems.append(err)
  return problems

_train = {}
def train_flags():
  if not _train:
    import train  # defines train.py's absl flags (and nothing else at import)
    from absl import flags
    from rove_jax import config as config_lib
    _train.update(FLAGS=flags.FLAGS, config_lib=config_lib)
  return _train["FLAGS"], _train["config_lib"]

def check_train(argv):
  FLAGS, config_lib = train_flags()
  # config_flags defines one flag per override while parsing: drop the previous command's.
  for name in [n for n in list(FLAGS) if n.startswith("config.")]:
    delattr(FLAGS, name)
  FLAGS.unparse_flags()
  saved, sys.argv = sys.argv, list(argv)  # config_flags reads the overrides from sys.argv
  try:
    rest = FLAGS(list(argv))
  except Exception as e:
    return [f"absl rejects {argv}: {type(e).__name__}: {e}"]
  finally:
    sys.argv = saved
  if rest[1:]:
    return [f"train.py rejects unexpected arguments {rest[1:]}"]
  if not FLAGS.workdir:
    return ["--workdir is empty"]
  try:
    config_lib.validate(FLAGS.config)
  except Exception as e:
    return [f"rove_jax.config.validate: {type(e).__name__}: {e}"]
  return []

def schema_has(path):
  _, config_lib = train_flags()
  node = config_lib.base_config("tiny")
  for part in path.split("."):
    if not hasattr(node, "keys") or part not in node:
      return False
    node = node[part]
  return True

def check_train_flags(names):
  FLAGS, _ = train_flags()
  problems = []
  for name in names:
    bare = name.lstrip("-")
    if bare.startswith("config."):
      if not schema_has(bare[len("config."):]):
        problems.append(f"{name}: no such config field (rove_jax/config.py:base_config)")
    elif bare not in FLAGS:
      problems.append(f"{name} is not a train.py flag")
  return problems

for job in jobs:
  try:
    if job["kind"] == "train":
      problems = check_train(job["argv"])
    elif job["kind"] == "train_flags":
      problems = check_train_flags(job["flags"])
    elif job["kind"] == "config_key":
      problems = [] if schema_has(job["path"]) else [f"config field {job['path']} does not exist"]
    elif job["kind"] == "argparse":
      problems = check_argparse(job)
    elif job["kind"] == "flag_anywhere":
      owners = [t for t in job["targets"] if job["flag"] in parser_for(t)[1]._option_string_actions]
      FLAGS, _ = train_flags()
      if job["flag"].lstrip("-") in FLAGS:
        owners.append("train.py")
      problems = [] if owners else [f"{job['flag']} is an option of none of {job['targets']} "
                                    f"or train.py"]
    else:
      problems = [f"unknown job kind {job['kind']}"]
  except Exception:
    problems = [traceback.format_exc()[-2000:]]
  results[job["id"]] = problems

with open(RESULTS_PATH, "w") as f:
  json.dump(results, f)
'''


def run_checker(jobs, tmp_dir: pathlib.Path) -> dict:
  jobs_file, out_file = tmp_dir / "jobs.json", tmp_dir / "results.json"
  jobs_file.write_text(json.dumps(jobs))
  p = subprocess.run([sys.executable, "-c", CHECKER, str(jobs_file), str(out_file)], cwd=ROOT,
                     env=clean_env(), capture_output=True, text=True, timeout=600)
  if p.returncode != 0 or not out_file.exists():
    return {j["id"]: [f"checker subprocess failed (exit {p.returncode}): {p.stderr[-3000:]}"]
            for j in jobs}
  return json.loads(out_file.read_text())


# ----------------------------------------------------------------------------- the tests

README_TEXT = README.read_text()
COMMANDS, _FLAGS = extract(README_TEXT)
INLINE_FLAGS = [f for f in _FLAGS if f.text not in GENERIC_CONFIG_FLAGS]

# Commands that must be rejected, with a piece of the expected reason: each check can fail.
BROKEN = [
    ("python train.py --config configs/tiny.py --workdir runs/x --config.model.no_such_field=1",
     "absl rejects"),
    ("python train.py --config configs/tiny.py --workdir runs/x --config.mesh.fsdp=0",
     "mesh.fsdp must be"),
    ("python train.py --config configs/tiny.py", "--workdir must have a value"),
    ("python train.py --config configs/tiny.py --workdir runs/x stray", "unexpected arguments"),
    ("python train.py --config configs/tiny.py --workdir runs/x [--no_such_flag=1]",
     "--no_such_flag is not a train.py flag"),
    ("python train.py --config configs/tiny.py --workdir runs/x [--config.model.nope=1]",
     "no such config field"),
    ("python -m eval --workdir runs/x --suite huge", "'huge' is not a choice"),
    ("python -m eval --wor runs/x", "--wor is not an option"),  # argparse would accept it
    ("python -m eval --workdir runs/x [--lengths 256,abc]", "--lengths must be"),
    ("python -m eval --workdir runs/x [--no-such-flag 3]", "--no-such-flag is not an option"),
    ("python -m eval --workdir runs/x [--stride half]", "not a valid stride"),
    ("python -m bench --suite tpu", "'tpu' is not a choice"),
    ("python -m bench.attention ratio|sideways", "does not offer 'sideways'"),
    ("python -m bench.model_step --no-such 1", "does not list --no-such"),
    ("python -m bench.no_such_module", "no such module"),
    ("python reproduce.py --encodings rove,alibi", "unknown ['alibi']"),
    ("make no_such_target", "no such target"),
    ("pip install -e '.[no_such_extra]'", "'no_such_extra' is not in pyproject.toml"),
    ("pip install requests", "not covered"),
    ("bash bench/no_such_script.sh", "no such script"),
    ("srun --nodes=2 python train.py ... --config.mesh.fsdp=0", "mesh.fsdp must be"),
    ("srun --nodes=2 python train.py ... --config.mesh.fsdp=2", "could not be run"),
    ('gcloud compute tpus tpu-vm ssh $TPU --command="cd elsewhere && python train.py ..."',
     "is not the checkout"),
    ("python examples/tour.py", "not covered"),
    ("cd somewhere", "not covered"),
    ("python train.py --config configs/tiny.py --workdir $NO_SUCH_VAR", "NO_SUCH_VAR"),
]
# Inline flag mentions that must be rejected: (text, section, piece of the reason).
BROKEN_FLAGS = [
    ("--config.model.no_such_field=1", "Training", "absl rejects"),
    ("--config.model.remat=sometimes", "Scaling out", "remat"),
    ("--config.mesh.data / fsdp / nope", "Scaling out", "mesh.nope does not exist"),
    ("--no-such-option", "Evaluation", "--no-such-option is not an option"),
    ("--no-such-option", "Start here", "is an option of none of"),
]
BROKEN_README = "# rove-jax\n\n    python train.py --config configs/tiny.py --workdir runs/x\n"


def _broken_commands():
  """Each broken command in its own block after BROKEN_README's valid train.py command (the
  flags `...` stands for), so a failure cannot leak from one to the next."""
  md = BROKEN_README + "".join(
      f"\nText.\n\n    {text}\n" if text.startswith(PREFIXES) else f"\n```bash\n{text}\n```\n"
      for text, _ in BROKEN)  # a line that is no known command: in a shell-typed fence
  cmds, _ = extract(md)
  assert [c.text for c in cmds[1:]] == [" ".join(t.split()) for t, _ in BROKEN]
  return list(zip(cmds[1:], [reason for _, reason in BROKEN]))


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
  """id -> problems, for the README's commands and inline flags and the broken controls;
  every check that imports JAX runs in one subprocess."""
  plans = {}
  for cmd in COMMANDS:
    plans[cmd.id] = plan_command(cmd, COMMANDS, README_TEXT)
  for flag in INLINE_FLAGS:
    plans[flag.id] = plan_flag(flag, COMMANDS)
  broken = _broken_commands()
  cmds = [c for c, _ in broken]
  context = extract(BROKEN_README)[0] + cmds
  for cmd in cmds:  # srun looks back for the flags `...` stands for: the valid command
    plans["broken:" + cmd.id] = plan_command(
        cmd, [c for c in context if c.line <= 3 or c is cmd], BROKEN_README)
  for text, section, _ in BROKEN_FLAGS:
    plans[f"brokenflag:{section}:{text}"] = plan_flag(
        Command(text, 0, 0, inline=True, section=section), COMMANDS)
  jobs = [dict(j, id=f"{key}|{j['id']}") for key, p in plans.items() for j in p.jobs]
  results = run_checker(jobs, tmp_path_factory.mktemp("readme"))
  out = {}
  for key, p in plans.items():
    problems = list(p.problems)
    for j in p.jobs:
      problems += results.get(f"{key}|{j['id']}", [f"no result for check {j['id']}"])
    out[key] = problems
  return out


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.id for c in COMMANDS])
def test_readme_command(cmd, verdicts):
  assert kind(cmd) in CHECKED_KINDS, f"README command not covered: {cmd.text}"
  problems = verdicts[cmd.id]
  assert not problems, f"README line {cmd.line}: {cmd.text}\n" + "\n".join(problems)


@pytest.mark.parametrize("flag", INLINE_FLAGS, ids=[f.id for f in INLINE_FLAGS])
def test_readme_inline_flag(flag, verdicts):
  problems = verdicts[flag.id]
  assert not problems, f"README line {flag.line}: {flag.text}\n" + "\n".join(problems)


@pytest.mark.parametrize("cmd,reason", _broken_commands(),
                         ids=[c.text[:90] for c, _ in _broken_commands()])
def test_checks_reject_broken_commands(cmd, reason, verdicts):
  problems = verdicts["broken:" + cmd.id]
  assert problems, f"a broken command passed every check: {cmd.text}"
  assert any(reason in p for p in problems), f"{cmd.text}: rejected, but not for {reason!r}: " \
      f"{problems}"


@pytest.mark.parametrize("text,section,reason", BROKEN_FLAGS,
                         ids=[f"{s}:{t}" for t, s, _ in BROKEN_FLAGS])
def test_checks_reject_broken_inline_flags(text, section, reason, verdicts):
  problems = verdicts[f"brokenflag:{section}:{text}"]
  assert any(reason in p for p in problems), f"{text}: not rejected for {reason!r}: {problems}"


def test_readme_extras_exist():
  mentioned = set()
  for group in re.findall(r"\.\[([\w,\s-]+)\]", README_TEXT):
    mentioned.update(e.strip() for e in group.split(",") if e.strip())
  assert mentioned, "the README names no pip extras"
  assert mentioned <= extras(), f"extras not in pyproject.toml: {sorted(mentioned - extras())}"


def test_extraction_finds_every_command():
  kinds = {}
  for cmd in COMMANDS:
    kinds.setdefault(kind(cmd), []).append(cmd.text)
  assert len(COMMANDS) >= 10, f"only {len(COMMANDS)} commands found in README.md: {kinds}"
  assert "uncovered" not in kinds, f"README commands not covered: {kinds['uncovered']}"
  assert set(kinds) <= set(CHECKED_KINDS)
  # The README's core commands are always there.
  for k in ("make", "train", "eval", "bench", "pip"):
    assert k in kinds, f"no {k} command extracted from README.md: {kinds}"
  assert {"make demo", "make test"} <= {c.text for c in COMMANDS}
  # Cross-check the block parser: every code line that starts like a command (outside python
  # blocks) lies inside an extracted command.
  spans = [(c.line, c.end_line) for c in COMMANDS if not c.inline]
  in_python = False
  for n, line in enumerate(README_TEXT.split("\n"), 1):
    if line.lstrip().startswith("```"):
      in_python = not in_python and "python" in line
      continue
    if in_python or not re.match(r"^(    |\t)", line):
      continue
    if line.strip().startswith(PREFIXES):
      assert any(a <= n <= b for a, b in spans), f"README line {n} not extracted: {line}"


def test_parsing_helpers():
  assert strip_comment("make demo   # trains") == "make demo"
  assert strip_comment("echo '#not' \"a # b\" x#y") == "echo '#not' \"a # b\" x#y"
  md = ("# t\n\n    python -m eval --workdir runs/a [--suite quick|full]\n"
        "                   [--out DIR]   # c\n    make demo\n\n"
        "    python train.py --config c.py \\\n        --workdir w\n\nText.\n\n"
        "    diagram -> x\n    python -m eval --workdir ... -> eval.scoring\n\n"
        "Use `pip install -e .` or `make test`.\n")
  cmds, _ = extract(md)
  assert [c.text for c in cmds] == [
      "python -m eval --workdir runs/a [--suite quick|full] [--out DIR]", "make demo",
      "python train.py --config c.py --workdir w", "python -m eval --workdir ...",
      "pip install -e .", "make test"]
  assert [c.inline for c in cmds] == [False] * 4 + [True] * 2
