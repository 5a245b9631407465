"""The import layers of rove_jax/ and study/, read from the source (AST; imports inside
functions count the same as those at the top): no import cycle; the core (the modules directly
under rove_jax/ and kernels/) imports only jax, numpy, the standard library and the core;
rove_jax/nn only the core, flax, jax, numpy and (optional) safetensors; and every import goes to
its own layer or an earlier one (LAYERS: core, storage, tasks, nn, data, train, evaluation,
aot, the commands in rove_jax/cli, study); rove_jax/tasks imports only numpy. And
`import rove_jax` loads none of the training, plotting or config libraries.

`import_graph()` returns the graph (and prints its size); `python -m tests.test_layers` prints
every module's imports.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rove_jax", "study")
STDLIB = frozenset(sys.stdlib_module_names)
CORE_EXTERNAL = frozenset({"jax", "numpy", "typing_extensions"}) | STDLIB
# safetensors: optional, imported where parameter files are read or written (nn/param_files.py)
NN_EXTERNAL = frozenset({"flax", "jax", "numpy", "safetensors"}) | STDLIB
# The path layer (rove_jax/storage): the standard library and gcsfs (the [gcs] extra) only.
STORAGE_EXTERNAL = frozenset({"gcsfs"}) | STDLIB
# What `import rove_jax` must not load: the training, checkpoint, data-pipeline, plotting and
# config libraries (the core needs jax and numpy only).
NOT_LOADED_BY_CORE = ("flax", "optax", "orbax", "grain", "matplotlib", "ml_collections", "chex")
# The layers in order (docs/architecture.md): a module may import its own layer and the ones
# before it. The commands (rove_jax/cli) sit above the layers they drive (rove-train's dry run
# compiles ahead of time; rove-eval restores what training wrote).
LAYERS = (
  ("core", None),
  ("storage", "rove_jax.storage"),
  ("tasks", "rove_jax.tasks"),
  ("nn", "rove_jax.nn"),
  ("data", "rove_jax.data"),
  ("train", "rove_jax.train"),
  ("evaluation", "rove_jax.evaluation"),
  ("aot", "rove_jax.aot"),
  ("commands", "rove_jax.cli"),
  ("study", "study"),
)


@dataclasses.dataclass(frozen=True)
class Edge:
  """One import: `source` imports `target` (a module of rove_jax/ or study/, or the top-level
  name of an outside package) at `line`, inside a function or class when `local`."""

  source: str
  target: str
  line: int
  local: bool
  internal: bool


def _module_files() -> dict:
  """{module name: path} of every .py file under rove_jax/ and study/."""
  out = {}
  for package in PACKAGES:
    for path in sorted((ROOT / package).rglob("*.py")):
      parts = list(path.relative_to(ROOT).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      out[".".join(parts)] = path
  return out


def _resolve(name: str, modules) -> str:
  """The module of `name` in the graph: itself, or its longest prefix that is a module."""
  parts = name.split(".")
  while parts and ".".join(parts) not in modules:
    parts.pop()
  return ".".join(parts) or name


def _targets(node, module: str, is_package: bool, modules) -> list:
  """(target, internal) of every name one import statement imports."""
  if isinstance(node, ast.Import):
    names = [alias.name for alias in node.names]
  else:
    base = node.module or ""
    if node.level:  # relative: against this module's package
      package = module.split(".") if is_package else module.split(".")[:-1]
      package = package[: len(package) - node.level + 1]
      base = ".".join(package + ([base] if base else []))
    # `from pkg import name` imports the submodule pkg.name when there is one.
    names = [
      f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
    ]
  out = []
  for name in dict.fromkeys(names):
    top = name.split(".")[0]
    out.append((_resolve(name, modules), True) if top in PACKAGES else (top, False))
  return list(dict.fromkeys(out))


def _edges(module: str, path: Path, modules) -> list:
  tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
  is_package = path.name == "__init__.py"
  edges = []

  def visit(node, local: bool):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.Import, ast.ImportFrom)):
        if isinstance(child, ast.ImportFrom) and child.module == "__future__":
          continue
        for target, internal in _targets(child, module, is_package, modules):
          if target != module:
            edges.append(Edge(module, target, child.lineno, local, internal))
      inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
      visit(child, local or inner)

  visit(tree, False)
  return edges


@functools.lru_cache(maxsize=None)
def import_graph() -> dict:
  """{module: [Edge, ...]} for every module of rove_jax/ and study/ (module docstring); prints
  the number of modules and import edges, for information."""
  modules = _module_files()
  graph = {m: _edges(m, path, modules) for m, path in modules.items()}
  edges = [e for es in graph.values() for e in es]
  internal = {(e.source, e.target) for e in edges if e.internal}
  local = {(e.source, e.target) for e in edges if e.internal and e.local}
  print(
    f"import graph: {len(graph)} modules, {len(internal)} edges between them "
    f"({len(local)} made only or also inside functions), "
    f"{len({(e.source, e.target) for e in edges if not e.internal})} to outside packages"
  )
  return graph


def _cycles(graph: dict) -> list:
  """The strongly connected components of more than one module (Tarjan), each sorted."""
  succ = {
    m: sorted({e.target for e in es if e.internal and e.target in graph}) for m, es in graph.items()
  }
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def connect(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in succ[v]:
      if w not in index:
        connect(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(succ):
    if v not in index:
      connect(v)
  return sorted(out)


def _describe(graph: dict, component) -> str:
  """The imports inside one cycle, as "a -> b (file line N, inside a function)" lines."""
  lines = []
  for m in component:
    for e in graph[m]:
      if e.internal and e.target in component:
        where = "inside a function" if e.local else "at module level"
        lines.append(f"  {e.source} -> {e.target} (line {e.line}, {where})")
  return "\n".join(lines)


def is_core(module: str) -> bool:
  """rove_jax itself, the modules directly under rove_jax/ and the kernels/ package."""
  parts = module.split(".")
  if parts[0] != "rove_jax":
    return False
  if len(parts) == 1 or parts[1] == "kernels":
    return True
  return len(parts) == 2 and not (ROOT / "rove_jax" / parts[1]).is_dir()


def _in(module: str, package: str) -> bool:
  return module == package or module.startswith(package + ".")


def _violations(graph: dict, sources, allowed) -> list:
  """ "source -> target (line N)" for every import of a module in `sources` that `allowed`
  (edge -> bool) refuses."""
  return [
    f"{e.source} -> {e.target} (line {e.line}{', inside a function' if e.local else ''})"
    for m in sorted(graph)
    if sources(m)
    for e in graph[m]
    if not allowed(e)
  ]


# ------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def graph():
  return import_graph()


def test_the_graph_sees_every_kind_of_import(graph):
  """The parser's own check: from-imports of submodules, package imports and function-local
  imports all become edges, and outside packages keep their top-level name."""
  edges = {(e.source, e.target, e.local) for es in graph.values() for e in es}
  assert ("rove_jax", "rove_jax.rotary", False) in edges  # from rove_jax import rotary
  assert ("rove_jax.evaluation.tasks", "rove_jax.evaluation.ruler.suite", False) in edges
  assert ("rove_jax.evaluation.icl.synthetic", "rove_jax.evaluation.prompting", False) in edges
  assert ("rove_jax.evaluation.plots", "matplotlib", True) in edges  # deferred, inside pyplot()
  assert ("rove_jax.evaluation.report_md", "numpy", False) in edges
  assert all(e.target in graph for es in graph.values() for e in es if e.internal), (
    "an import of rove_jax or study names no module"
  )


def test_no_import_cycle(graph):
  cycles = _cycles(graph)
  assert not cycles, "import cycles (modules, then the imports that close them):\n" + "\n".join(
    f"{' <-> '.join(c)}\n{_describe(graph, c)}" for c in cycles
  )


def test_core_imports_only_jax_numpy_the_standard_library_and_core(graph):
  bad = _violations(
    graph, is_core, lambda e: is_core(e.target) if e.internal else e.target in CORE_EXTERNAL
  )
  assert not bad, "core modules importing outside the core:\n" + "\n".join(bad)


def test_storage_imports_only_itself_gcsfs_and_the_standard_library(graph):
  storage = lambda m: _in(m, "rove_jax.storage")
  bad = _violations(
    graph, storage, lambda e: storage(e.target) if e.internal else e.target in STORAGE_EXTERNAL
  )
  assert not bad, "rove_jax.storage importing outside itself and gcsfs:\n" + "\n".join(bad)


def test_tasks_import_only_themselves_numpy_and_the_standard_library(graph):
  tasks = lambda m: _in(m, "rove_jax.tasks")
  bad = _violations(
    graph, tasks, lambda e: tasks(e.target) if e.internal else e.target in STDLIB | {"numpy"}
  )
  assert not bad, "rove_jax.tasks importing outside itself and numpy:\n" + "\n".join(bad)


def test_nn_imports_only_core_storage_nn_flax_jax_numpy_and_the_standard_library(graph):
  nn = lambda m: _in(m, "rove_jax.nn")
  bad = _violations(
    graph,
    nn,
    lambda e: (
      (is_core(e.target) or nn(e.target) or _in(e.target, "rove_jax.storage"))
      if e.internal
      else e.target in NN_EXTERNAL
    ),
  )
  assert not bad, "rove_jax.nn importing outside core, nn, flax, jax, numpy:\n" + "\n".join(bad)


def layer(module: str) -> int:
  """The index in LAYERS of a module of rove_jax/ or study/."""
  if is_core(module):
    return 0
  for i, (_, package) in enumerate(LAYERS):
    if package is not None and _in(module, package):
      return i
  raise AssertionError(f"{module} belongs to no layer of LAYERS: add it there")


def test_a_layer_never_imports_a_later_one(graph):
  bad = _violations(
    graph, lambda m: True, lambda e: not e.internal or layer(e.target) <= layer(e.source)
  )
  names = " -> ".join(name for name, _ in LAYERS)
  assert not bad, f"imports against the layer order {names}:\n" + "\n".join(bad)


@pytest.mark.parametrize(
  "source, target",
  [
    ("rove_jax.train.loop", "rove_jax.evaluation.scoring"),  # train -> evaluation
    ("rove_jax.nn.model", "rove_jax.train.loop"),  # nn -> train
    ("rove_jax.attention", "rove_jax.nn.model"),  # core -> nn
    ("rove_jax.evaluation.scoring", "study.stats"),  # evaluation -> study
  ],
)
def test_the_layer_order_catches_a_wrong_way_import(source, target):
  assert layer(target) > layer(source)


def test_import_rove_jax_loads_no_training_plotting_or_config_library():
  code = (
    "import json, sys; import rove_jax; "
    f"print(json.dumps([m for m in {list(NOT_LOADED_BY_CORE)!r} if m in sys.modules]))"
  )
  out = subprocess.run(
    [sys.executable, "-c", code],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env={**subprocess_env(), "PYTHONPATH": str(ROOT)},
  )
  assert out.returncode == 0, out.stderr
  assert json.loads(out.stdout.splitlines()[-1]) == []


if __name__ == "__main__":
  for module, module_edges in import_graph().items():
    print(module)
    for e in module_edges:
      print(f"  -> {e.target}{' (inside a function)' if e.local else ''}")
