"""The packages' imports run one way: the layers docs/layout.md's Layout section lists (the
library's, then the apps'), no cycles, the library never importing an app, and no package
attribute that shadows a submodule."""

import ast
import importlib
import re
from pathlib import Path

import chex

from benchmarks.house import import_nodes  # the import graph's edges (TYPE_CHECKING ones too)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minigpt_jax"
APPS = ROOT / "minigpt_apps"
SUBPACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
# Every module by its path under minigpt_jax/ without .py ("model/gpt", "cli"); a subpackage's
# __init__ is not a layer of its own (it imports nothing of the package: test below).
LIBRARY_MODULES = sorted(
    str(p.relative_to(PACKAGE).with_suffix(""))
    for p in PACKAGE.rglob("*.py")
    if not (p.name == "__init__.py" and p.parent != PACKAGE)
)
# The apps' modules by their path from the repository root ("minigpt_apps/lab/app"): a layer
# table of their own, above the whole library.
APP_MODULES = sorted(
    str(p.relative_to(ROOT).with_suffix("")) for p in APPS.rglob("*.py") if p.name != "__init__.py"
)
MODULES = LIBRARY_MODULES + APP_MODULES


def _is_app(module: str) -> bool:
    return module.startswith("minigpt_apps/")


def _source_file(module: str) -> Path:
    return (ROOT if _is_app(module) else PACKAGE).joinpath(f"{module}.py")


def readme_layers() -> dict[str, int]:
    """{module: layer} from docs/layout.md's layer table: lines `  <n>  a.py model/b.py ...` (a
    two-digit layer takes one of the two leading spaces)."""
    layout = ROOT.joinpath("docs", "layout.md").read_text().split("## Layout", 1)[1]
    layers = {}
    for number, names in re.findall(r"^ {1,2}(\d{1,2}) {2}((?:\S+\.py ?)+)$", layout, re.MULTILINE):
        for name in names.split():
            layers[name.removesuffix(".py")] = int(number)
    return layers


def _module_of(dotted: str) -> str | None:
    """ "model/gpt" for minigpt_jax.model.gpt, "minigpt_apps/lab/app" for minigpt_apps.lab.app;
    None for a (sub)package itself."""
    if dotted.split(".")[0] == "minigpt_apps":
        name = dotted.replace(".", "/")
        return name if name in APP_MODULES else None
    parts = dotted.split(".")[1:]
    if not parts:
        return "__init__"
    name = "/".join(parts)
    if name in MODULES:
        return name
    return None


def package_imports(module: str) -> set[str]:
    """The minigpt_jax and minigpt_apps modules `module` imports anywhere in its source
    (function bodies too): `from minigpt_jax.model import gpt` counts as model/gpt, `from
    minigpt_jax import cli` as cli; `from minigpt_jax.model.gpt import forward` as model/gpt."""
    found = set()
    for node in import_nodes(ast.parse(_source_file(module).read_text())):
        if isinstance(node, ast.Import):
            dotted_names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            dotted_names = []
            for alias in node.names:
                child = _module_of(f"{node.module}.{alias.name}")
                dotted_names.append(
                    f"{node.module}.{alias.name}" if child is not None else node.module
                )
        else:
            continue
        for dotted in dotted_names:
            if dotted.split(".")[0] not in ("minigpt_jax", "minigpt_apps"):
                continue
            target = _module_of(dotted)
            if target is None:
                raise AssertionError(f"{module} imports the subpackage {dotted}: name a module")
            found.add(target)
    found.discard(module)
    return found


class LayoutTest(chex.TestCase):
    def test_readme_lists_every_module_once(self):
        self.assertCountEqual(readme_layers(), MODULES)

    def test_imports_point_to_lower_layers_only(self):
        """Within the library and within the apps, by the tables; an app may import any module
        of the library (it sits above it all)."""
        layers = readme_layers()
        wrong = [
            f"{module} (layer {layers[module]}) imports {dep} (layer {layers[dep]})"
            for module in MODULES
            for dep in sorted(package_imports(module))
            if _is_app(dep) == _is_app(module) and layers[dep] >= layers[module]
        ]
        self.assertEmpty(wrong, "imports against docs/layout.md's layer order")

    def test_the_library_imports_no_app(self):
        """The apps left the library (issue 35): cli finds their commands as entry points."""
        wrong = [
            f"{module} imports {dep}"
            for module in LIBRARY_MODULES
            for dep in sorted(package_imports(module))
            if _is_app(dep)
        ]
        self.assertEmpty(wrong)
        sources = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
        self.assertNotIn('import_module("minigpt_apps', sources)

    def test_the_app_commands_are_installed_entry_points(self):
        from minigpt_jax.cli import app_commands

        self.assertEqual(
            {name: entry.value for name, entry in app_commands().items()},
            {
                "lab": "minigpt_apps.lab.command:main",
                "sweep": "minigpt_apps.sweep.command:main",
                "compare": "minigpt_apps.compare.command:main",
                "scale": "minigpt_apps.scale.command:main",
            },
        )

    def test_no_import_cycle(self):
        graph = {module: package_imports(module) for module in MODULES}
        done, path = set(), []

        def visit(module):
            if module in path:
                self.fail(f"import cycle: {' -> '.join(path[path.index(module) :] + [module])}")
            if module in done:
                return
            path.append(module)
            for dep in sorted(graph[module]):
                visit(dep)
            path.pop()
            done.add(module)

        for module in MODULES:
            visit(module)

    def test_data_modules_import_no_training_model_or_sampling_module(self):
        """The data layer sits under training: a lock both need lives in a neutral module
        (issue 22: data/shards imported train/run_lock for its prepare lock)."""
        wrong = [
            f"{module} imports {dep}"
            for module in MODULES
            if module.startswith("data/")
            for dep in sorted(package_imports(module))
            if dep.startswith(("train/", "model/", "sampling/")) or _is_app(dep)
        ]
        self.assertEmpty(wrong)

    def test_finds_imports_in_function_bodies(self):
        """The checker itself: cli imports the loop and sampling lazily, inside functions."""
        self.assertContainsSubset(
            {"train/loop", "sampling/command", "config_dict"}, package_imports("cli")
        )

    def test_subpackage_inits_import_nothing_of_the_package(self):
        """So no layer hides in them; settings/ alone re-exports the plug-in API of its own
        two modules, a leaf and the groups above it (`from minigpt_jax.settings import setting,
        declares, options_of`)."""
        layers = readme_layers()
        for name in SUBPACKAGES:
            tree = ast.parse(PACKAGE.joinpath(name, "__init__.py").read_text())
            imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
            modules = [n.module for n in imports if n.module.startswith("minigpt_jax")]
            if name == "settings":
                own = [m.removeprefix("minigpt_jax.").replace(".", "/") for m in modules]
                self.assertEqual({layers[m] for m in own}, {0, 1}, own)
                self.assertTrue(all(m.startswith("settings/") for m in own), own)
            else:
                self.assertEmpty(modules, name)

    def test_no_package_attribute_shadows_a_submodule(self):
        for module in LIBRARY_MODULES:
            if module.endswith(("__init__", "__main__")):
                continue
            parent, _, name = f"minigpt_jax/{module}".rpartition("/")
            imported = importlib.import_module(f"minigpt_jax.{module.replace('/', '.')}")
            package = importlib.import_module(parent.replace("/", "."))
            self.assertIs(getattr(package, name), imported, module)


def legend_letters() -> set[str]:
    """The shape letters model.py's docstring defines: `  X  meaning` entries of its legend."""
    doc = ast.get_docstring(ast.parse(PACKAGE.joinpath("model", "gpt.py").read_text()))
    legend = doc.split("Shape letters", 1)[1].split("\n\n", 1)[0]
    letters = set(re.findall(r"(?:^|\s{2})([A-Z]\d?)(?=\s{1,2}\S)", legend, re.MULTILINE))
    letters |= set(re.findall(r"\b([A-Z]), ([A-Z]), ([A-Z])\b", legend)[0])
    return letters


class ShapeLegendTest(chex.TestCase):
    def test_every_suffix_letter_of_the_package_is_in_the_legend(self):
        legend = legend_letters()
        self.assertContainsSubset({"B", "T", "T1", "K", "C", "N", "G", "L"}, legend)
        used = {}
        for path in [*PACKAGE.rglob("*.py"), *APPS.rglob("*.py")]:
            for name in re.findall(
                r"\b[a-z][a-z0-9_]*_([A-Z][A-Z0-9]*(?:x[A-Z0-9]+)*)\b", path.read_text()
            ):
                for letter in name.split("x"):
                    if not letter.isdigit():
                        used.setdefault(letter, path.name)
        unknown = {letter: where for letter, where in used.items() if letter not in legend}
        self.assertEmpty(unknown, "shape letters missing from model.py's legend")


def test_the_readmes_core_names_library_modules_that_exist():
    """README's "The core" lists the files to read first (benchmarks/house.py measures them)."""
    from benchmarks.house import core_files

    core = core_files(ROOT)
    assert len(core) >= 10, core
    assert [f for f in core if not (ROOT / f).is_file()] == []
    assert "minigpt_jax/train/step.py" in core and "minigpt_jax/model/gpt.py" in core


def test_the_readmes_core_states_each_files_line_count():
    """README's "The core" gives each file's line count, `minigpt_jax/x.py (N lines)` or `(N)`;
    each must equal the file's (`wc -l`), so a moved or grown core file is caught here: update
    the README's list (the site's Layout page includes it)."""
    from benchmarks.house import core_files

    section = ROOT.joinpath("README.md").read_text().split("## The core", 1)[1].split("\n## ")[0]
    stated = dict(re.findall(r"`(minigpt_jax/[\w/]+\.py)` \((\d+)(?: lines)?\)", section))
    assert sorted(stated) == core_files(ROOT), "every core file in the README needs its count"
    actual = {
        name: str(len(ROOT.joinpath(name).read_bytes().splitlines()))
        for name in stated
        if ROOT.joinpath(name).is_file()
    }
    wrong = {name: (count, actual.get(name)) for name, count in stated.items()}
    wrong = {name: pair for name, pair in wrong.items() if pair[0] != pair[1]}
    assert wrong == {}, f"README's core: {{file: (stated, actual lines)}} {wrong}"
