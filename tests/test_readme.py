"""README.md and the guides, checked: every python block runs and every command works, by kind.

The pages: README.md (a front page of at most MAX_README_LINES lines that links every other
page), docs/*.md, results/README.md and bench/README.md; their relative links and anchors
resolve. Commands come from indented and shell-fenced blocks and inline spans, each checked once
(on the first page that has it). `make T`: its dry run;
rove-train / train.py: absl and the config's validation; rove-eval, bench[.X], reproduce.py,
rove-lm-eval (lm_eval's own `run` parser): their argparse parsers (a command of the retired
`python -m eval` is refused: the checkout has no eval/ package); pip: extras
in pyproject.toml; bash: `bash -n`; srun /
gcloud: not runnable here, as the page says below them, and the train command inside parses. A
synopsis
(`[--x v]`, `a|b`) parses in each expansion; with `...`, `<x>`, or inline, only names and
choices are checked. SAMPLES proves that each check rejects a bad command.
"""

import argparse
import collections
import contextlib
import importlib
import io
import itertools
import pathlib
import re
import shlex
import subprocess
import sys
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # configs
ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# page (relative to ROOT) -> its markdown: the front page first, then the guides.
PAGES = {
  p: (ROOT / p).read_text()
  for p in [
    "README.md",
    *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
    "results/README.md",
    "bench/README.md",
  ]
}
MAX_README_LINES = 230
CHECKOUT = re.search(r"^# (\S+)", README, re.M).group(1)  # the directory a clone makes
STARTS = (
  "make ",
  "python ",
  "python3 ",
  "pip ",
  "bash ",
  "srun ",
  "gcloud ",
  "rove-train",
  "rove-eval",
  "rove-prepare",
  "rove-export",
  "rove-lm-eval",
  ".venv/bin/",
)
SHELL_FENCES = ("bash", "sh", "shell", "console")
PLACEHOLDERS = {
  "$RANK": "0",
  "$TPU": "my-tpu",
  "$ZONE": "us-central2-b",
  "$BUCKET": "my-bucket",
  "git+<this repository>": "git+THIS-REPO",
}
MAKE_EXPECTS = {
  "demo": ["-m venv", "train.py", ".venv/bin/rove-eval"],
  "test": ["-m venv", ".[test]", "-m pytest"],
  "reproduce": ["reproduce.py"],
}
CHECKOUT_FILES = {"train": "train.py", "eval": "eval/__main__.py", "reproduce": "reproduce.py"}
SCRIPTS = {
  "rove-train": "rove_jax.cli.train:run",
  "rove-eval": "rove_jax.cli.eval:main",
  "rove-prepare": "rove_jax.cli.prepare:run",
  "rove-export": "rove_jax.cli.export:main",
  "rove-lm-eval": "rove_jax.cli.harness:main",
}
GENERIC = ("--config.field=value", "--config.x=y")  # the override syntax, not a field
PIP_OK = ("-e", "--editable", "-U", "--upgrade", "-q", "--quiet", "git+THIS-REPO", "pip")
# A fenced block (lang, body) and an indented one (after a blank line; blank lines inside).
FENCED = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([\w+-]*).*\n((?:.*\n)*?) {0,3}\1.*$", re.M)
INDENTED = re.compile(r"(?:\A|(?<=\n\n)) {4}.*\S.*(?:\n(?: {4}.*|[ \t]*)$)*", re.M)


# text: continuations joined, comment dropped; line: 1-based, where it starts in the markdown
Command = collections.namedtuple("Command", "text line inline", defaults=[False])


def strip_comment(line: str) -> str:
  """Drops a shell comment: a `#` that starts a word outside quotes."""
  for m in re.finditer(r"""'[^']*'|"(?:\\.|[^"\\])*"|\\.|(?P<c>(?<!\S)#)|\S""", line):
    if m.group("c"):
      return line[: m.start()].rstrip()
  return line.rstrip()


def code_blocks(md: str):
  """([(line of its first line, its lines, lang or None if indented)], the prose around them,
  where every code line is replaced by ``` so that no inline span crosses code)."""
  blocks = []

  def take(m, start, lang, body):  # -> as many ``` lines as the match has
    blocks.append((m.string.count("\n", 0, start) + 1, body.splitlines(), lang))
    return "\n".join(["```"] * (m[0].count("\n") + 1))

  prose = FENCED.sub(lambda m: take(m, m.start(3), m[2].lower(), m[3]), md)
  prose = INDENTED.sub(
    lambda m: take(m, m.start(), None, re.sub(r"(?m)^ {4}", "", m[0].rstrip())), prose
  )
  return sorted(blocks), prose


def block_commands(line: int, block, lang) -> list:
  """A block's commands, continuations joined. In a shell block a deeper-indented line continues
  a command (a wrapped synopsis) and any other line is one (a check must cover it); elsewhere
  (a diagram, a listing) only lines that start like a command count, cut at ` -> `."""
  shell = lang in SHELL_FENCES or "".join(block[:1]).lstrip().startswith(STARTS)
  out, buf = [], None  # [README line, indent, text]; buf: a logical line being joined
  for n, raw in enumerate(block):
    buf = buf or [line + n, len(raw) - len(raw.lstrip()), ""]
    buf[2] = f"{buf[2]} {strip_comment(raw).strip()}".strip()
    if buf[2].endswith("\\"):
      buf[2] = buf[2][:-1]
      continue
    command, buf = buf, None
    if not shell:
      out += [command[:2] + [command[2].split(" -> ")[0]]] * command[2].startswith(STARTS)
    elif out and not command[2].startswith(STARTS) and command[1] > out[-1][1]:
      out[-1][2] += " " + command[2]
    elif command[2]:
      out.append(command)
  return [Command(" ".join(text.split()), n) for n, _, text in out]


def extract(md: str) -> list:
  """md's commands (and --flags in inline spans) in order, deduplicated by text."""
  blocks, prose = code_blocks(md)
  commands = [
    c
    for line, block, lang in blocks
    if lang in (None, "", *SHELL_FENCES)
    for c in block_commands(line, block, lang)
  ]
  for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
    text = " ".join(m.group(1).split())
    if text.startswith(STARTS) or text.startswith("--") and text not in GENERIC:
      commands.append(Command(text, prose.count("\n", 0, m.start()) + 1, True))
  return [c for i, c in enumerate(commands) if c.text not in {d.text for d in commands[:i]}]


def words(text: str) -> list:
  """argv: placeholders filled in, `.venv/bin/python3` -> python, `.venv/bin/rove-eval` ->
  rove-eval, `python -m pip` -> pip."""
  text = re.sub("|".join(map(re.escape, PLACEHOLDERS)), lambda m: PLACEHOLDERS[m[0]], text)
  if "$" in text:
    raise ValueError(f"a shell variable without a value in PLACEHOLDERS: {text}")
  tokens = shlex.split(text)
  tokens[:1] = [
    re.sub(r"^(?:.*/)?(python)3?$|^(?:.*/)?(rove-[\w-]+)$", r"\1\2", t) for t in tokens[:1]
  ]
  return ["pip", *tokens[3:]] if tokens[:3] == ["python", "-m", "pip"] else tokens


def program(tokens):
  """(kind, the module whose parser checks it or None, its argv)."""
  head, rest = tokens[0], tokens[1:]
  if head in ("rove-train", "rove-eval"):  # train.py and rove_jax.cli.eval, installed
    head = head[5:]
  elif head in SCRIPTS:  # the module whose main() the script runs
    head = SCRIPTS[head].split(":")[0]
  if head == "python" and rest[:1] == ["-m"]:
    head, rest = "".join(rest[1:2]), rest[2:]
  elif head == "python" and rest[:1] in (["train.py"], ["reproduce.py"]):
    head, rest = rest[0][:-3], rest[1:]
  kind = head.split(".")[0]
  if kind == "reproduce" and any(a.split("=")[0] == "--scale" for a in rest):
    return kind, "study.paper_recipe", rest  # reproduce.py --scale: the paper-scale recipe
  known = ("train", "eval", "reproduce", "bench", "rove_jax", "study")  # python -m <module>
  return kind, head if kind in known else None, rest


def expansions(tokens) -> list:
  """A synopsis with every option given, once per alternative of `a|b`."""
  toks = [t.strip("[]") for t in tokens if t.strip("[]") not in ("", "...")]
  n = max([len(t.split("|")) for t in toks] + [1])
  return [[t.split("|")[min(k, len(t.split("|")) - 1)] for t in toks] for k in range(n)]


def option_names(tokens) -> list:
  return [t.strip("[]").split("=")[0] for t in tokens if t.strip("[]").startswith("-")]


def toml_table(name: str) -> dict:
  """key -> raw value of a table of pyproject.toml (Python 3.10 has no tomllib)."""
  text = (ROOT / "pyproject.toml").read_text()
  body = re.search(rf"^\[{re.escape(name)}\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
  return dict(re.findall(r"^([\w.-]+)\s*=\s*(.*)$", body.group(1) if body else "", re.M))


def argparse_problems(target, args, mode) -> list:
  """Option names and `a|b` choices exist; unless mode is "reference", the command (or each
  expansion of a synopsis) passes the program's parse_args, or its main's parser."""
  if str(ROOT) not in sys.path:  # reproduce.py and bench/ run from the checkout
    sys.path.insert(0, str(ROOT))
  mod = importlib.import_module(
    {"eval": "rove_jax.cli.eval", "bench": "bench.__main__"}.get(target, target)
  )
  parse = getattr(mod, "parse_args", None) or mod.main
  with (
    mock.patch.object(
      argparse.ArgumentParser, "parse_args", autospec=True, side_effect=LookupError
    ) as grab,
    mock.patch.object(
      argparse.ArgumentParser, "parse_known_args", autospec=True, side_effect=LookupError
    ) as grab_known,
    contextlib.suppress(LookupError),
  ):
    parse([])  # builds its parser, caught before anything runs
  known = grab.call_args is None  # parse_known_args: the rest are --config overrides (bench.aot)
  parser = (grab_known if known else grab).call_args.args[0]
  if known:

    def parse(argv):
      rest = parser.parse_known_args(argv)[1]
      bad = [a for a in rest if a.startswith("-") and not a.startswith("--config")]
      if bad:
        parser.error(f"unrecognized arguments: {bad}")
  elif parse.__name__ != "parse_args":
    parse = parser.parse_args
  choices = {c for a in parser._actions for c in (a.choices or ())}
  problems = [
    f"{n} is not an option of {target}"
    for n in option_names(args)
    if n not in parser._option_string_actions and not (known and n.startswith("--config"))
  ]
  problems += [
    f"{alt!r} is not a choice of {target}"
    for t in args
    if "|" in t
    for alt in t.strip("[]").split("|")
    if alt not in choices
  ]
  for argv in {"exact": [args], "synopsis": expansions(args)}.get(mode, []):
    out = io.StringIO()
    try:
      with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        parse(list(argv))
    except SystemExit as e:
      problems.append(f"{argv} rejected (exit {e.code}): {out.getvalue().strip()[-800:]}")
  return problems


def train_problems(args, mode) -> list:
  """rove-train's absl flags (parsed on the global FLAGS, reset after) and the validation."""
  from absl import flags

  from rove_jax.cli import train as train_cli
  from rove_jax.train import overrides

  FLAGS = flags.FLAGS

  def known(name):
    return name[2:] in FLAGS or bool(
      name.startswith("--config.") and overrides.problem(name[9:], "1") is None
    )

  if mode == "reference":
    return [f"{n}: no such train flag or config field" for n in option_names(args) if not known(n)]
  problems = []
  for argv in [["rove-train", *a] for a in (expansions(args) if mode == "synopsis" else [args])]:
    try:  # --config NAME -> a packaged config, as rove-train does
      argv = train_cli._rewrite_config_flag(argv)
      given = overrides.split(argv[1:])
      rest = FLAGS([a for a in argv if not a.startswith("--config.")])
      problems += [f"rove-train: unexpected arguments {rest[1:]}"] * bool(rest[1:])
      overrides.apply(overrides.load_file(FLAGS.config), given)
    except Exception as e:
      problems.append(f"rove-train {' '.join(argv[1:])} rejected: {type(e).__name__}: {e}")
    finally:
      FLAGS.unparse_flags()
  return problems


def make_problems(kind, args, context) -> list:
  """A Makefile target whose dry run runs what MAKE_EXPECTS says, evaluates the workdirs it
  trains, and each pip / train / eval / reproduce line of it passes its own check."""
  makefile, problems = (ROOT / "Makefile").read_text(), []
  assert not re.search(r"^\t[@-]*\+", makefile, re.M), "`make -n` would run the `+` lines"
  for t in [a for a in args if "=" not in a and not a.startswith("-")] or [None]:
    if t not in re.findall(r"^([\w.-]+)\s*:(?!=)", makefile, re.M):
      problems.append(f"make {t}: no such target in the Makefile")
      continue
    # -n prints the recipes without running them; -B prints all, whatever .venv's state.
    p = subprocess.run(
      ["make", "-n", "-B", "--no-print-directory", *[a for a in args if "=" in a], t],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=60,
    )
    trained, evaluated = _workdirs(p.stdout)
    problems += [f"`make -n {t}` exited {p.returncode}: {p.stderr[-800:]}"] * bool(p.returncode)
    problems += [
      f"`make -n {t}` does not run `{e}`" for e in MAKE_EXPECTS.get(t, []) if e not in p.stdout
    ]
    problems += [
      f"make {t} evaluates {sorted(evaluated)}, not what it trains {sorted(trained)}"
    ] * bool(trained and evaluated and trained != evaluated)
    problems += [
      q
      for sub in map(words, p.stdout.splitlines())
      if sub and program(sub)[0] in ("pip", "train", "eval", "reproduce")
      for q in command_problems(sub, context)
    ]
  return problems


def _workdirs(recipe: str) -> tuple:
  """(the train lines' --workdir values, the eval lines' --workdir and --compare values)."""
  trained, evaluated = set(), set()
  for sub in filter(None, map(words, recipe.splitlines())):
    kind, _, args = program(sub)
    for i, a in enumerate(args):
      if kind == "train" and a == "--workdir":
        trained.add(args[i + 1])
      elif kind == "eval" and a in ("--workdir", "--compare"):
        evaluated.update(itertools.takewhile(lambda w: not w.startswith("-"), args[i + 1 :]))
  return trained, evaluated


def pip_problems(kind, args, context) -> list:
  """`pip install` of this package (with extras) or of its URL; pip upgrading itself."""
  extras = toml_table("project.optional-dependencies")
  problems = [] if args[:1] == ["install"] and args[1:] else ["pip: not an install"]
  for a in (a for a in args[1:] if a not in PIP_OK):
    # `.`, `.[extras]` in a checkout, or `rove_jax[extras] @ git+URL` from anywhere
    m = re.fullmatch(
      r"(?:\.|rove_jax(?=\[.*\] @ git\+THIS-REPO$))(?:\[([\w,-]*)\])?"
      r"(?: @ git\+THIS-REPO)?",
      a,
    )
    problems += (
      [
        f"pip extra {e!r} is not in pyproject.toml's optional-dependencies {sorted(extras)}"
        for e in (m.group(1) or "").split(",")
        if e and e not in extras
      ]
      if m
      else [f"pip install {a}: not covered"]
    )
  return problems


def bash_problems(kind, args, context) -> list:
  path = ROOT / "".join(args[:1])
  p = path.is_file() and subprocess.run(["bash", "-n", path], capture_output=True, text=True)
  return (
    [] if p and not p.returncode else [f"bash {args[:1]}: {p.stderr if p else 'no such script'}"]
  )


def cluster_problems(kind, args, context) -> list:
  """srun / gcloud: the page says below them that they could not be run here; the train
  command that they run parses (`...`: the flags of the train command above on that page)."""
  readme, before, line = context
  names = {"srun": "GPU-cluster|SLURM", "gcloud": "TPU"}[kind]  # in one sentence, below it
  said = re.search(
    rf"({names})(?:[^.;]|[.;]\S)*could\s+not\s+be\s+run", readme.split("\n", line - 1)[-1]
  )
  problems = [] if said else [f"the page does not say the {kind} command could not be run"]
  if kind == "srun":  # srun's options, then the command
    sub = args[next((i for i, a in enumerate(args) if not a.startswith("--")), len(args)) :]
  else:  # --command="cd CHECKOUT && ...", the checkout named by README.md's title
    cd, _, remote = next((a[10:] for a in args if a.startswith("--command=")), "").partition("&&")
    if cd.split() != ["cd", CHECKOUT]:
      problems.append(f"gcloud does not `cd` into the checkout: {cd!r}")
    sub = shlex.split(remote)
  if "..." in sub:
    same = [p[2] for p in (program(words(c.text)) for c in before) if p[0] == "train"]
    sub[sub.index("...") : sub.index("...") + 1] = (same or [["--no-train-command-before"]])[-1]
  return problems + (
    command_problems(sub, context)
    if sub and program(sub)[0] == "train"
    else [f"not covered: {kind} runs {sub[:2]}"]
  )


# kind -> the check of a command that no argparse / absl parser covers: f(kind, args, context)
CHECKS = {
  "make": make_problems,
  "pip": pip_problems,
  "bash": bash_problems,
  "srun": cluster_problems,
  "gcloud": cluster_problems,
}


def command_problems(tokens, context, inline=False) -> list:
  """What is wrong with one command; context: (its page, the commands above it, its line)."""
  kind, target, args = program(tokens)
  if target is None:
    return (
      CHECKS[kind](kind, args, context)
      if kind in CHECKS
      else [f"README command not covered: {' '.join(tokens)}"]
    )
  got = toml_table("project.scripts").get(tokens[0], "").strip('"')
  if tokens[0] in SCRIPTS and got != SCRIPTS[tokens[0]]:  # what runs is what is parsed here
    return [f"{tokens[0]} is {got!r} in pyproject.toml's scripts, not {SCRIPTS[tokens[0]]}"]
  if tokens[0] not in SCRIPTS and not (ROOT / CHECKOUT_FILES.get(kind, "bench")).exists():
    return [f"{' '.join(tokens[:3])}: no {CHECKOUT_FILES[kind]} in the checkout"]
  mode = (
    "reference"
    if inline or any(t == "..." or re.search(r"<.*>", t) for t in args)
    else "synopsis"
    if any("[" in t or "|" in t for t in args)
    else "exact"
  )
  return train_problems(args, mode) if kind == "train" else argparse_problems(target, args, mode)


def problems_of(cmd: Command, readme: str = README, commands=None) -> list:
  """What is wrong with a command of the markdown page `readme` (whose commands are `commands`,
  extracted if None), or an inline --flag: `--config.a=V` (N: a number) applies to the tiny
  config, in `--config.a.b / c` a.b and a.c are config fields, and any other --flag is an
  option of a README program."""
  if re.fullmatch(r"--config\.[\w.]+=.*", cmd.text):
    return train_problems(
      ["--config", "tiny", "--workdir", "x", re.sub("=N$", "=1", cmd.text)], "exact"
    )
  if cmd.text.startswith("--"):
    first, *siblings = re.split(r"\s*/\s*", cmd.text)
    names = [first] + [f"{first.rsplit('.', 1)[0]}.{s}" for s in siblings]
    aot = () if first.startswith("--config") else ("bench.aot",)  # it passes --config on
    if any(
      not argparse_problems(t, names, "reference")
      for t in ("eval", "reproduce", "study.paper_recipe", "bench", "rove_jax.cli.harness") + aot
    ):
      return []
    return [
      f"{p}, nor an option of another README program" for p in train_problems(names, "reference")
    ]
  try:
    before = [
      c
      for c in (extract(readme) if commands is None else commands)
      if c.line < cmd.line and not c.inline
    ]
    return command_problems(words(cmd.text), (readme, before, cmd.line), cmd.inline)
  except (ValueError, ImportError) as e:  # shell syntax, `python -m` of no module
    return [f"{cmd.text}: {type(e).__name__}: {e}"]


EXTRACTED = {page: extract(md) for page, md in PAGES.items()}
# (page, command): each command text once, on the first page that has it
COMMANDS = [(page, c) for page, cs in EXTRACTED.items() for c in cs]
COMMANDS = [
  (p, c) for i, (p, c) in enumerate(COMMANDS) if c.text not in {d.text for _, d in COMMANDS[:i]}
]
# (page, its python blocks' code)
PY_BLOCKS = [
  (page, code)
  for page, md in PAGES.items()
  for code in re.findall(r"^```python\n(.*?)^```", md, re.M | re.S)
]

# A python block of a page (found by a phrase of it) -> what it must compute.
EXPECT = {
  "y_long = rj.": lambda s: chex.assert_shape([s["y"], s["y_long"]], (2, 128, 8, 64)),
  "nnx.data(rj.Rope(": lambda s: chex.assert_shape(s["y"], (2, 16, 64)),
  "minimal.rove_attention(": lambda s: chex.assert_shape(s["y"], (2, 16, 4, 32)),
  "generate(": lambda s: (
    chex.assert_shape(s["logits"], (2, 1024, s["model"].config.vocab_size)),  # YaRN at 4x
    chex.assert_shape(s["out"], (1, 8 + 64)),
    np.testing.assert_array_equal(s["out"][:, :8], s["prompt"]),
  ),
}

# A command (or an inline --flag) of each form, and the reason a check must give to reject it
# ("": it must pass): proof that the checks can fail, and that the README's forms pass.
SAMPLES = [
  ("rove-train --config tiny --workdir x --config.steps=10 --config.optim.warmup_steps=2", ""),
  ("rove-eval --workdir runs/x --suite quick", ""),
  ("rove-eval --workdir runs/x [--suite quick|full] [--compare runs/y ...]", ""),
  ("python -m rove_jax.cli.eval --workdir runs/x --yarn all", ""),
  ("python -m eval --workdir runs/x", "no eval/__main__.py in the checkout"),  # retired
  ("srun --nodes=2 python train.py ... --config.mesh.fsdp=2", ""),
  ("rove-train --config tiny --workdir runs/x --config.model.no_such_field=1", "rejected"),
  ("rove-train --config no_such_config --workdir runs/x", "packaged config"),
  ("rove-train --config tiny --workdir runs/x --config.steps=10", "warmup_steps=50 must be"),
  ("rove-eval --wor runs/x", "--wor is not an option"),  # argparse would take it
  ("rove-lm-eval --model rove_jax --model_args path=x --tasks t --batch_size 4", ""),
  ("rove-lm-eval --model rove_jax --no_such_option 1", "--no_such_option is not an option"),
  ("rove-eval --workdir runs/x [--lengths 256,abc]", "--lengths must be"),
  ("rove-eval --workdir runs/x [--yarn on|sideways]", "'sideways' is not a choice"),
  ("python -m bench.attention ratio|sideways", "'sideways' is not a choice"),
  ("python reproduce.py --encodings rove,alibi", "unknown ['alibi']"),
  ("make no_such_target", "no such target"),
  ("make demo DEMO_ARGS=--config.steps=x", "rove-train --config.steps=x --workdir"),
  ("pip install -e '.[no_such_extra]'", "'no_such_extra' is not in pyproject.toml"),
  ("bash bench/no_such_script.sh", "no such script"),
  ("srun --nodes=2 python train.py ... --config.mesh.fsdp=0", "could not be run"),
  ('gcloud compute tpus tpu-vm ssh $TPU --command="cd elsewhere && rove-train ..."', "cd"),
  ("cd somewhere", "not covered"),
  ("--config.model.no_such_field=1", "rejected"),
  ("--config.steps=x", "steps"),
  ("--config.mesh.data / nope", "mesh.nope: no such"),
  ("--no-such", "no such train flag"),
]


@pytest.mark.parametrize(
  "page,cmd", COMMANDS, ids=[f"{p}:L{c.line}:{c.text[:60]}" for p, c in COMMANDS]
)
def test_page_command(page, cmd):
  problems = problems_of(cmd, PAGES[page], EXTRACTED[page])
  assert not problems, f"{page} line {cmd.line}: {cmd.text}\n" + "\n".join(problems)


@pytest.mark.parametrize("text,reason", SAMPLES, ids=[t[:70] for t, _ in SAMPLES])
def test_checks_on_samples(text, reason):
  """text in a sample README (a --flag inline), after a train command (what `...` stands for),
  followed by the sentence that cluster commands need unless it must be rejected."""
  md = (
    "# rove-jax\n\n    rove-train --config tiny --workdir runs/x --process_id=0\n\n"
    + (f"Use `{text}`.\n" if text.startswith("--") else f"```bash\n{text}\n```\n\n")
    + "The SLURM job could not be run here.\n" * (not reason)
  )
  commands = extract(md)
  assert [c.text for c in commands][1:] == [" ".join(text.split())]
  problems = problems_of(commands[1], md, commands)
  assert any(reason in p for p in problems) if reason else not problems, problems


def test_extraction():
  kinds = {program(words(c.text))[0] for _, c in COMMANDS}
  assert {"make", "train", "eval", "bench", "pip", "srun", "gcloud"} <= kinds, kinds
  assert {"make demo", "make test"} <= {c.text for c in EXTRACTED["README.md"]}
  missing = [p for p in EXPECT if not any(p in code for _, code in PY_BLOCKS)]
  assert not missing, f"the pages lost their python example(s) using {missing}"
  extras = set(toml_table("project.optional-dependencies"))
  for page, md in PAGES.items():
    texts = " | ".join(c.text for c in EXTRACTED[page])
    for _, block, lang in code_blocks(md)[0]:  # no command line is missed
      for raw in block if lang in (None, "", *SHELL_FENCES) else []:
        line = " ".join(strip_comment(raw).split(" -> ")[0].split()).rstrip(" \\")
        assert not line.startswith(STARTS) or line in texts, f"{page}: not extracted: {raw}"
    named = {e for g in re.findall(r"\.\[([\w,-]+)\]", md) for e in g.split(",")}  # prose too
    named |= set(re.findall(r"`\[([\w-]+)\]`", md))  # an extra named alone: `[gcs]`
    assert named <= extras, f"{page} names extras not in pyproject.toml: {named - extras}"
  md = (
    "# t\n\n    rove-eval --workdir a [--suite quick|full]\n              [--out D]  # c\n"
    "    make demo \\\n        X=1\n\nText.\n\n    a diagram -> x\n    rove-eval ... -> y\n\n"
    "```python\n\n    python x.py\n```\nUse `pip install .`, `--stride`.\n"
  )
  assert extract(md) == [
    ("rove-eval --workdir a [--suite quick|full] [--out D]", 3, False),
    ("make demo X=1", 5, False),
    ("rove-eval ...", 11, False),
    ("pip install .", 17, True),
    ("--stride", 17, True),
  ]
  assert strip_comment("""echo x#y "a # b" '#c' # real""") == """echo x#y "a # b" '#c'"""


@pytest.mark.parametrize(
  "i",
  range(len(PY_BLOCKS)),
  ids=[  # page:its block number
    f"{p}:{[q for q, _ in PY_BLOCKS[: i + 1]].count(p)}" for i, (p, _) in enumerate(PY_BLOCKS)
  ],
)
def test_page_python_block_runs(i):
  page, code = PY_BLOCKS[i]
  scope = {}
  exec(compile(code, f"{page} python block", "exec"), scope)  # noqa: S102
  for name, value in scope.items():
    if isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jnp.inexact):
      assert np.isfinite(np.asarray(value)).all(), f"{name} is not finite"
  for phrase, expect in EXPECT.items():
    if phrase in code:
      expect(scope)


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def links(md: str) -> list:
  """The targets of md's links and images, outside code blocks and inline code."""
  return LINK.findall(re.sub(r"`[^`\n]*`", "", code_blocks(md)[1]))


def anchors(md: str) -> set:
  """The anchors GitHub gives md's headings: lower case, punctuation dropped, spaces to -,
  a repeated one numbered -1, -2, ..."""
  seen, out = collections.Counter(), set()
  for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", code_blocks(md)[1], re.M):
    slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    out.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
    seen[slug] += 1
  return out


def resolved(page: str, target: str):
  """(the file a relative link of page names, relative to ROOT, or None outside the
  checkout; its anchor)."""
  path, _, anchor = target.partition("#")
  dest = ((ROOT / page).parent / path).resolve() if path else ROOT / page
  with contextlib.suppress(ValueError):
    return dest.relative_to(ROOT).as_posix(), anchor
  return None, anchor


@pytest.mark.parametrize("page", PAGES)
def test_page_links_resolve(page):
  bad = []
  for target in links(PAGES[page]):
    if re.match(r"[a-z][\w+.-]*:", target):  # https:, mailto:
      continue
    dest, anchor = resolved(page, target)
    if dest is None or not (ROOT / dest).exists():
      bad.append(f"{target}: no such file")
    elif anchor and (not dest.endswith(".md") or anchor not in anchors((ROOT / dest).read_text())):
      bad.append(f"{target}: no heading #{anchor} in {dest}")
  assert not bad, f"{page}: " + "; ".join(bad)


def test_readme_is_a_front_page_that_links_every_guide():
  lines = len(README.splitlines())
  assert lines <= MAX_README_LINES, f"README.md has {lines} lines, more than {MAX_README_LINES}"
  linked = {resolved("README.md", t)[0] for t in links(README)}
  unlinked = sorted(set(PAGES) - {"README.md"} - linked)
  assert not unlinked, f"README.md does not link {unlinked}"
  assert anchors("# A\n## What `make demo` prints\n## Will it fit? Yes, from any host\n## A\n") == {
    "a",
    "what-make-demo-prints",
    "will-it-fit-yes-from-any-host",
    "a-1",
  }
