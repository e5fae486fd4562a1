"""The package's imports run one way: the layers the README's Layout section lists, no cycles,
and no package attribute that shadows a submodule."""

import ast
import importlib
import re
from pathlib import Path

import chex

import minigpt_jax

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minigpt_jax"
# Modules, and subpackages (e.g. lab/) taken whole: a subpackage is one unit of a layer.
SUBPACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
MODULES = sorted([p.stem for p in PACKAGE.glob("*.py")] + SUBPACKAGES)


def _source_files(module: str) -> list[Path]:
    if module in SUBPACKAGES:
        return sorted(PACKAGE.joinpath(module).rglob("*.py"))
    return [PACKAGE.joinpath(f"{module}.py")]


def readme_layers() -> dict[str, int]:
    """{module: layer} from the README's layer table: lines `  <n>  a.py b/ ...`."""
    layout = ROOT.joinpath("README.md").read_text().split("## Layout", 1)[1]
    layers = {}
    for number, names in re.findall(r"^ {2}(\d) {2}((?:\S+(?:\.py|/) ?)+)$", layout, re.MULTILINE):
        for name in names.split():
            layers[name.removesuffix(".py").removesuffix("/")] = int(number)
    return layers


def package_imports(module: str) -> set[str]:
    """The minigpt_jax modules `module` imports anywhere in its source (function bodies too);
    `from minigpt_jax import name` counts as importing the submodule `name` if there is one,
    else the package's __init__."""
    found = set()
    nodes = [n for f in _source_files(module) for n in ast.walk(ast.parse(f.read_text()))]
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "minigpt_jax":
                for alias in node.names:
                    found.add(alias.name if alias.name in MODULES else "__init__")
                continue
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "minigpt_jax":
                found.add(parts[1] if len(parts) > 1 else "__init__")
    found.discard(module)
    return found


class LayoutTest(chex.TestCase):
    def test_readme_lists_every_module_once(self):
        self.assertCountEqual(readme_layers(), MODULES)

    def test_imports_point_to_lower_layers_only(self):
        layers = readme_layers()
        wrong = [
            f"{module} (layer {layers[module]}) imports {dep} (layer {layers[dep]})"
            for module in MODULES
            for dep in sorted(package_imports(module))
            if layers[dep] >= layers[module]
        ]
        self.assertEmpty(wrong, "imports against README.md's layer order")

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

    def test_finds_imports_in_function_bodies(self):
        """The checker itself: cli imports train and runs lazily, inside functions."""
        self.assertContainsSubset({"train", "runs", "run_config"}, package_imports("cli"))

    def test_no_package_attribute_shadows_a_submodule(self):
        for module in MODULES:
            if module in ("__init__", "__main__"):
                continue
            imported = importlib.import_module(f"minigpt_jax.{module}")
            self.assertIs(getattr(minigpt_jax, module), imported, module)


def legend_letters() -> set[str]:
    """The shape letters model.py's docstring defines: `  X  meaning` entries of its legend."""
    doc = ast.get_docstring(ast.parse(PACKAGE.joinpath("model.py").read_text()))
    legend = doc.split("Shape letters", 1)[1].split("\n\n", 1)[0]
    letters = set(re.findall(r"(?:^|\s{2})([A-Z]\d?)(?=\s{1,2}\S)", legend, re.MULTILINE))
    letters |= set(re.findall(r"\b([A-Z]), ([A-Z]), ([A-Z])\b", legend)[0])
    return letters


class ShapeLegendTest(chex.TestCase):
    def test_every_suffix_letter_of_the_package_is_in_the_legend(self):
        legend = legend_letters()
        self.assertContainsSubset({"B", "T", "T1", "K", "C", "N", "G", "L"}, legend)
        used = {}
        for path in PACKAGE.rglob("*.py"):
            for name in re.findall(
                r"\b[a-z][a-z0-9_]*_([A-Z][A-Z0-9]*(?:x[A-Z0-9]+)*)\b", path.read_text()
            ):
                for letter in name.split("x"):
                    if not letter.isdigit():
                        used.setdefault(letter, path.name)
        unknown = {letter: where for letter, where in used.items() if letter not in legend}
        self.assertEmpty(unknown, "shape letters missing from model.py's legend")
