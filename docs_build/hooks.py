"""MkDocs hooks of the documentation site (mkdocs.yml): the figures of experiments/ and
benchmarks/, whose READMEs the site includes where they are, and the table of every setting,
made at build time from the declarations `minigpt-jax settings` reads, so it cannot drift."""

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
# The folders of figures the included READMEs link to (`figures/x.png` beside each README).
FIGURES = ("experiments/figures", "benchmarks/figures")
SETTINGS_MARKER = "<!-- the settings table, made by docs_build/hooks.py -->"
REGISTRIES_MARKER = "<!-- the registries table, made by docs_build/hooks.py -->"


def on_files(files, config):
    for folder in FIGURES:
        for path in sorted((ROOT / folder).glob("*.png")):
            uri = str(path.relative_to(ROOT))
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_markdown())
    if REGISTRIES_MARKER in markdown:
        markdown = markdown.replace(REGISTRIES_MARKER, registries_markdown())
    return markdown


def settings_markdown() -> str:
    """Every setting, group by group, as markdown tables: key, default, kind and doc."""
    from minigpt_jax.config_dict import settings_rows

    out, last = [], None
    for group, name, default, kind, doc in settings_rows():
        if group != last:
            title = f"config.{group}" if group else "config"
            out += ["", f"### `{title}`", "", "| key | default | kind | doc |", "|---|---|---|---|"]
            last = group
        cells = (f"`{name}`", f"`{default!r}`", kind, doc)
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def registries_markdown() -> str:
    """Every registry: the config key that picks it, where it is defined, its built-in entries."""
    import sys

    from minigpt_jax import config_dict  # noqa: F401 (imports every registry)
    from minigpt_jax.settings.registry import REGISTRIES

    where = {}
    for name, module in sorted(sys.modules.items()):
        if name.startswith("minigpt_jax.") and module is not None:
            for attr, value in vars(module).items():
                if attr.isupper() and any(value is r for r in REGISTRIES.values()):
                    where.setdefault(id(value), f"{name}.{attr}")
    out = ["| config key | registry | built-in entries |", "|---|---|---|"]
    for key, registry in sorted(REGISTRIES.items()):
        entries = ", ".join(f"`{n}`" for n in registry.names())
        out.append(f"| `{key}` | `{where.get(id(registry), '?')}` | {entries} |")
    return "\n".join(out) + "\n"
