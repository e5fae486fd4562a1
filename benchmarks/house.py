"""The house's figures, measured the same way on any checkout of minigpt-jax: the library's lines
and files, its largest modules and functions, the files and functions one training step passes
through (from the command line to the optimizer update and back to the metrics line), blocks of
six or more lines repeated in the library, the import graph (layers, cycles), how many times
the model config is built in a run and on a resume, and how many config parameters are typed
`Any`.

  python benchmarks/house.py                   # this checkout
  python benchmarks/house.py --repo OTHER      # another checkout (e.g. a git worktree of main)

The step path is measured by running the code, not by reading it: `minigpt-jax train` on the
tiny config runs in a child process under a profiler, four times (3 to 6 steps, one step per
call, evaluation and checkpoints only at the end). A function is on the path when it runs while JAX
traces the train step (the Python code that is the step: loss, model, optimizer update), or
when each step more calls it the same number of times more (the host's work per step: the batch,
the dispatch, the metrics line), and so are the package's functions that call those (the command
line down to the loop). Lines are the definitions' lines of the functions on the path, each
counted once (a nested function's lie in its parent's), and of them the code lines. The path
is measured twice: with the default config, and with the speed settings set to the plain path
(`PLAIN`: the reference core alone). The import graph counts `TYPE_CHECKING` imports too.
"""

from __future__ import annotations

import argparse
import ast
import collections
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = "minigpt_jax"
REPEAT_LINES = 6


def library_files(repo: Path) -> list[Path]:
    return sorted((repo / PACKAGE).rglob("*.py"))


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def code_line_numbers(path: Path) -> set[int]:
    """The numbers (from 1) of the lines of code: not blank, not only a comment, not a
    docstring."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(value.lineno, value.end_lineno + 1))
    lines = path.read_text().splitlines()
    return {
        number
        for number, line in enumerate(lines, 1)
        if line.strip() and not line.strip().startswith("#") and number not in docstrings
    }


def code_lines(path: Path) -> int:
    """Lines of code: not blank, not only a comment, not a docstring."""
    return len(code_line_numbers(path))


def core_files(repo: Path) -> list[str]:
    """The core's files as the README's "The core" section lists them (`minigpt_jax/...py`)."""
    readme = (repo / "README.md").read_text()
    if "## The core" not in readme:
        return []
    section = readme.split("## The core", 1)[1].split("\n## ", 1)[0]
    return sorted(set(re.findall(r"`(minigpt_jax/[\w/]+\.py)`", section)))


def functions(repo: Path) -> list[tuple[str, str, int]]:
    """(file, qualified name, lines) of every function and method of the library."""
    return [(rel, name, last - first + 1) for rel, name, first, last in function_spans(repo)]


def function_spans(repo: Path) -> list[tuple[str, str, int, int]]:
    """(file, qualified name, first line, last line) of every function and method of the
    library (a nested function's lines lie inside its parent's)."""
    found = []
    for path in library_files(repo):
        rel = str(path.relative_to(repo / PACKAGE))

        def visit(node, prefix, rel=rel):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = prefix + child.name
                    found.append((rel, name, child.lineno, child.end_lineno))
                    visit(child, name + ".", rel)
                elif isinstance(child, ast.ClassDef):
                    visit(child, prefix + child.name + ".", rel)

        visit(ast.parse(path.read_text()), "")
    return found


def repeated_blocks(repo: Path) -> tuple[int, int]:
    """(blocks, lines): runs of REPEAT_LINES or more code lines (stripped, blank and comment
    lines left out) that stand in two places or more of the library, counted once per extra
    place, and the lines those extra places hold."""
    windows = collections.defaultdict(list)
    files = {}
    for path in library_files(repo):
        lines = [
            line.strip()
            for line in path.read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")
        ]
        files[path] = lines
        for i in range(len(lines) - REPEAT_LINES + 1):
            window = lines[i : i + REPEAT_LINES]
            if sum(len(line) > 3 for line in window) < REPEAT_LINES - 1:
                continue  # mostly punctuation: not a block of its own
            if all(line.startswith(("import ", "from ")) for line in window):
                continue
            key = hashlib.sha1("\n".join(window).encode()).hexdigest()
            windows[key].append((path, i))
    repeated = {place for places in windows.values() if len(places) > 1 for place in places[1:]}
    # Merge overlapping windows into blocks: consecutive starts in one file are one block.
    blocks, lines = 0, 0
    for path in files:
        starts = sorted(i for p, i in repeated if p == path)
        end = -1
        for start in starts:
            if start > end:
                blocks += 1
                lines += REPEAT_LINES
            else:
                lines += start + REPEAT_LINES - 1 - end
            end = start + REPEAT_LINES - 1
    return blocks, lines


def import_nodes(tree: ast.AST):
    """Every node of `tree`, the bodies of `if TYPE_CHECKING:` included: a type-only import is
    an edge of the import graph too (a circle through one is still a circle to a reader)."""
    return ast.walk(tree)


def module_imports(repo: Path) -> dict[str, set[str]]:
    """{module: the library modules it imports anywhere in its source}, modules by dotted name."""
    modules = {}
    for path in library_files(repo):
        rel = path.relative_to(repo).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in import_nodes(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != PACKAGE:
                    found.add(target)
        graph[name] = found
    return graph


def layers(graph: dict[str, set[str]]) -> tuple[int | None, list[list[str]]]:
    """(the number of layers, the cycles): a module's layer is one above its highest import."""
    layer, cycles, stack = {}, [], []

    def visit(module):
        if module in stack:
            cycles.append(stack[stack.index(module) :] + [module])
            return 0
        if module in layer:
            return layer[module]
        stack.append(module)
        layer[module] = 1 + max((visit(dep) for dep in sorted(graph[module])), default=-1)
        stack.pop()
        return layer[module]

    for module in sorted(graph):
        visit(module)
    return (None if cycles else max(layer.values()) + 1), cycles


def room_cycles(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Pairs of rooms (the package's top-level folders and modules) that import each other."""

    def room(module):
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else parts[0]

    edges = {(room(a), room(b)) for a, deps in graph.items() for b in deps if room(a) != room(b)}
    return sorted((a, b) for a, b in edges if (b, a) in edges and a < b)


# ----------------------------------------------------------------------------- the step path


# The speed settings set to the plain path: flax's Dense and LayerNorm under autodiff, float32
# operands, the explicit softmax attention (the reference core alone, no speed entry).
PLAIN = (
    "--config.model.dense_grad=autodiff",
    "--config.model.norm_grad=autodiff",
    "--config.model.matmul_dtype=float32",
    "--config.model.attention=explicit",
)


def _trace_child(steps: int, workdir: str, extra: list[str]) -> None:
    """In the child: runs `train` under a profiler, prints {"calls": ..., "traced": ...}."""
    package_dir = os.path.join(os.getcwd(), PACKAGE) + os.sep
    calls = collections.Counter()  # (function, the package's callers above it) -> calls
    traced = set()

    def name(frame):
        code = frame.f_code
        qualname = getattr(code, "co_qualname", code.co_name)
        return (os.path.relpath(code.co_filename, package_dir), qualname, code.co_firstlineno)

    def ours(frame):
        return frame.f_code.co_filename.startswith(package_dir)

    def is_step(frame):
        return frame.f_code.co_name == "train_chunk" and "step" in frame.f_code.co_filename

    def profile(frame, event, arg):
        if event != "call" or not ours(frame):
            return
        key, chain, under_step, caller = name(frame), [], is_step(frame), frame.f_back
        while caller is not None:
            if ours(caller):
                chain.append(name(caller))
                under_step = under_step or is_step(caller)
            caller = caller.f_back
        calls[(key, tuple(chain))] += 1
        if under_step:
            traced.add(key)

    sys.argv = [
        "minigpt-jax", "train", "--config", "configs/tiny.py", "--workdir", workdir,
        f"--config.num_steps={steps}", "--config.steps_per_call=1", "--config.log_every=1",
        "--config.eval_every=1000", "--config.checkpoint_every=1000",
        "--config.optim.warmup_steps=0", "--progress=false", *extra,
    ]  # fmt: skip
    from minigpt_jax import cli

    sys.setprofile(profile)
    try:
        cli.main()
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    print(
        "HOUSE-TRACE "
        + json.dumps(
            {
                "calls": [
                    [list(k), [list(c) for c in chain], n] for (k, chain), n in calls.items()
                ],
                "traced": [list(k) for k in traced],
            }
        )
    )


def _trace(repo: Path, steps: int, workdir: str | None = None, extra: tuple = ()) -> dict:
    """The child's calls for `steps` steps, in a fresh workdir, or in `workdir` (a resume);
    `extra`: more command-line flags (`PLAIN`)."""
    with tempfile.TemporaryDirectory() as fresh:
        env = {**os.environ, "PYTHONPATH": str(repo), "MINIGPT_JAX_COMPILATION_CACHE": "off"}
        child = [sys.executable, str(Path(__file__).resolve()), "--trace-child", str(steps)]
        result = subprocess.run(
            [*child, workdir or fresh, *extra],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    for line in result.stdout.splitlines():
        if line.startswith("HOUSE-TRACE "):
            return json.loads(line.removeprefix("HOUSE-TRACE "))
    raise SystemExit(f"the traced run failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")


def step_path(repo: Path, extra: tuple = ()) -> tuple[set[tuple], dict[tuple, tuple]]:
    """The functions (file, qualname, first line) on one step's path, and their (first, last)
    lines (`extra`:
    flags of the traced command, `PLAIN` for the plain path)."""

    def counted(trace):
        return {(tuple(k), tuple(map(tuple, chain))): n for k, chain, n in trace["calls"]}

    runs = [_trace(repo, steps, extra=extra) for steps in (3, 4, 5, 6)]
    counts = [counted(run) for run in runs]
    path = {tuple(k) for k in runs[-1]["traced"]}
    for (key, chain), n in counts[-1].items():
        seen = [count.get((key, chain), 0) for count in counts]
        more = n - seen[-2]
        # Called more often by the same amount for each step more, over three steps more: the
        # step's own work (a count that changes for another reason, such as the number of
        # files an orbax save happens to write, 16 to 18, is not).
        if more >= 1 and all(b - a == more for a, b in itertools.pairwise(seen)):
            path.add(key)
            path.update(chain)
    spans = {}
    for file, qualname, _ in path:
        for rel, name, first, last in function_spans(repo):
            if rel == file and name == qualname.replace(".<locals>", ""):
                spans[(file, qualname)] = (first, last)
    return path, spans


def path_lines(repo: Path, spans: dict[tuple, tuple[int, int]]) -> tuple[int, int]:
    """(lines, code lines) of the path's definitions, each source line counted once (a nested
    function's lie inside its parent's; code: `code_line_numbers`)."""
    lines, code = 0, 0
    for file in {file for file, _ in spans}:
        numbers = set()
        for (rel, _), (first, last) in spans.items():
            if rel == file:
                numbers.update(range(first, last + 1))
        lines += len(numbers)
        code += len(numbers & code_line_numbers(repo / PACKAGE / file))
    return lines, code


CONFIG_NAMES = {"config", "cfg", "optim", "data_config", "mesh_config", "experiment"}


def config_typed_any(repo: Path) -> int:
    """Parameters of the library's functions named like a config (`CONFIG_NAMES`) and annotated
    `Any` (or not annotated at all)."""
    count = 0
    for path in library_files(repo):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                count += sum(
                    1
                    for arg in args
                    if arg.arg in CONFIG_NAMES
                    and (arg.annotation is None or ast.unparse(arg.annotation) == "Any")
                )
    return count


def model_config_builds(repo: Path) -> tuple[int, int]:
    """GPTConfig objects made (each `__post_init__`: a construction or a `replace`) in the
    traced command's fresh run of 3 steps, and in its resume to step 4 in the same workdir."""

    def builds(trace: dict) -> int:
        return sum(
            n
            for key, _, n in trace["calls"]
            if key[0] == "model/config.py" and key[1] == "GPTConfig.__post_init__"
        )

    with tempfile.TemporaryDirectory() as workdir:
        return builds(_trace(repo, 3, workdir)), builds(_trace(repo, 4, workdir))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--trace-child":
        _trace_child(int(sys.argv[2]), sys.argv[3], sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--most", type=int, default=8, help="largest modules/functions shown")
    args = parser.parse_args()
    repo = Path(args.repo).resolve()

    files = library_files(repo)
    sizes = {str(p.relative_to(repo / PACKAGE)): line_count(p) for p in files}
    print(f"library ({repo / PACKAGE}): {sum(sizes.values()):,} lines in {len(files)} files")
    print("largest modules: " + ", ".join(
        f"{name} {n}" for name, n in sorted(sizes.items(), key=lambda x: -x[1])[: args.most]
    ))  # fmt: skip
    defs = sorted(functions(repo), key=lambda f: -f[2])[: args.most]
    print("largest functions: " + ", ".join(f"{f}:{name} {n}" for f, name, n in defs))
    core = core_files(repo)
    if core:
        print(
            f"the core (README's list): {len(core)} files, "
            f"{sum(line_count(repo / f) for f in core):,} lines, "
            f"{sum(code_lines(repo / f) for f in core):,} of them code (no docstring, comment "
            "or blank line)"
        )
    blocks, lines = repeated_blocks(repo)
    print(f"repeated blocks of {REPEAT_LINES}+ lines: {blocks} ({lines} lines)")
    graph = module_imports(repo)
    count, cycles = layers(graph)
    print(
        f"imports (TYPE_CHECKING ones included): {sum(len(d) for d in graph.values())} between "
        f"{len(graph)} modules, {count} layers, {len(cycles)} module cycles, rooms importing "
        "each other: " + (", ".join(f"{a}<->{b}" for a, b in room_cycles(graph)) or "none")
    )
    fresh, resumed = model_config_builds(repo)
    print(
        f"model config (GPTConfig) built: {fresh} times in a fresh run, {resumed} on a resume; "
        f"parameters named like a config and typed Any (or untyped): {config_typed_any(repo)}"
    )
    for label, extra in (("default config", ()), ("speed set to plain", PLAIN)):
        print_step_path(repo, label, extra)


def print_step_path(repo: Path, label: str, extra: tuple) -> None:
    path, path_spans = step_path(repo, extra)
    lines, code = path_lines(repo, path_spans)
    path_files = sorted({file for file, _, _ in path})
    comprehensions = sum(
        1 for _, name, _ in path if re.search(r"<(genexpr|listcomp|dictcomp|setcomp)>$", name)
    )
    print(
        f"one training step ({label}): {len(path_files)} files, {len(path)} functions "
        f"({len(path) - comprehensions} without comprehensions), "
        f"{lines:,} lines of them ({code:,} code)"
    )
    by_file = collections.defaultdict(list)
    for file, qualname, _ in sorted(path):
        by_file[file].append(re.sub(r"\.<locals>", "", qualname))
    for file in path_files:
        print(f"  {file}: {', '.join(by_file[file])}")


if __name__ == "__main__":
    main()
