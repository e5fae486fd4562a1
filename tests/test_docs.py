"""The README and the documentation site (mkdocs.yml, docs/) checked like code: the pages'
```python blocks run as written, every dotted name they mention imports, the API reference lists
every public name, the README's commands are CI's and run as written, and the site builds with
warnings as errors, offline."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import extending_files

import minigpt_jax

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted((REPO / "docs").rglob("*.md"))
README = REPO / "README.md"
# A ```python block opens with `# name.py`: the file it is, as a researcher would save it.
PYTHON_BLOCK = re.compile(r"```python\n# (\w+\.py)(?::[^\n]*)?\n(.*?)```", re.S)
# Run by tests/test_api_doc.py, which checks what it prints (200 steps: ~20 s).
RUN_ELSEWHERE = {"train_script.py": "tests/test_api_doc.py"}
# Module paths a page names because they are gone (docs/layout.md: no shims at 0.1.0).
GONE = {"minigpt_jax.io.pretrained", "minigpt_jax.registry"}
# Dotted names that are not Python names: the entry-point group of the commands (pyproject.toml).
NOT_PYTHON = {"minigpt_jax.commands"}
# A dotted name ending so is a file's name (`config.json`, `metrics.jsonl`, `dense.py`).
FILE_SUFFIXES = ("py", "json", "jsonl", "safetensors", "txt", "md", "csv", "parquet", "bin", "npy")


def page_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def python_blocks() -> dict[str, tuple[str, str]]:
    """{file name: (page, source)} of every ```python block of README.md and docs/."""
    found = {}
    for page in [README, *PAGES]:
        text = page_text(page)
        blocks = PYTHON_BLOCK.findall(text)
        assert len(blocks) == text.count("```python\n"), (
            f"{page.relative_to(REPO)}: a ```python block must open with `# name.py` (or be shown "
            "as ```text when it is not meant to run)"
        )
        for name, source in blocks:
            assert name not in found, f"{name} is shown twice"
            found[name] = (str(page.relative_to(REPO)), source)
    return found


def _run(args, cwd, timeout=600, **env):
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )


# ---------------------------------------------------------------------------- the code blocks


def test_every_python_block_is_a_named_file_and_run_by_a_test():
    """Each block is a plug-in file (docs/extending/: imported here, trained with by the
    extending tests), a script run here, or one a named test runs."""
    blocks = python_blocks()
    plugins = set(extending_files())
    scripts = set(SCRIPTS)
    for name, test in RUN_ELSEWHERE.items():
        assert name in (REPO / test).read_text(), (name, test)
    unclaimed = set(blocks) - plugins - scripts - set(RUN_ELSEWHERE)
    assert unclaimed == set(), f"python blocks no test runs: {unclaimed}"
    assert plugins <= set(blocks) and scripts <= set(blocks)


@pytest.mark.slow  # a fresh interpreter
def test_the_plugin_files_import_as_written(tmp_path):
    """docs/extending/'s files, written into a folder outside the package, import (their
    decorators and declarations run) in a fresh interpreter."""
    files = extending_files()
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    modules = sorted(Path(name).stem for name in files)
    code = f"import importlib\nfor m in {modules!r}:\n    importlib.import_module(m)\nprint('ok')"
    result = _run([sys.executable, "-c", code], tmp_path, PYTHONPATH=f"{tmp_path}:{REPO}")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


# Each script block and a check of what it prints.
SCRIPTS = {
    "model_api.py": lambda out: out.strip() == "(2, 64, 512) float32 867072",
    "train_tiny.py": lambda out: re.fullmatch(r"step 40: val loss \d\.\d{4}", out.splitlines()[-1]),
}


@pytest.mark.slow  # a subprocess each, one trains
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_script_blocks_run_as_written(name, tmp_path):
    page, source = python_blocks()[name]
    (tmp_path / name).write_text(source)
    result = _run([sys.executable, name], tmp_path, timeout=300)
    assert result.returncode == 0, f"{page}'s {name}: {result.stderr[-3000:]}"
    assert SCRIPTS[name](result.stdout), f"{page}'s {name} printed {result.stdout!r}"


# ------------------------------------------------------------------------------ dotted names


def _subpackages(root: Path) -> list[str]:
    return sorted(
        str(p.parent.relative_to(root.parent)).replace("/", ".") for p in root.rglob("__init__.py")
    )


PACKAGES = _subpackages(REPO / "minigpt_jax") + _subpackages(REPO / "minigpt_apps")
MODULE_NAMES = {
    p.stem for root in ("minigpt_jax", "minigpt_apps") for p in (REPO / root).rglob("*.py")
} | {name.rsplit(".", 1)[-1] for name in PACKAGES}


def _resolves(dotted: str) -> bool:
    """Whether `a.b.c` imports: the longest module prefix, then attributes."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def _config_keys() -> dict[str, set[str]]:
    """{group: keys} of every declared setting, the built-in entries' and the pages' plug-ins'."""
    from minigpt_jax.config_dict import settings_rows

    keys: dict[str, set[str]] = {}
    for group, name, *_ in settings_rows():
        keys.setdefault(group, set()).add(name)
    for source in extending_files().values():  # settings the pages' plug-ins declare
        for name in re.findall(r"(\w+)(?:: \w+ )?=\s*setting\(", source):
            for group in keys:
                keys[group].add(name)
    return keys


def mentioned_names() -> dict[str, str]:
    """{dotted name: page} of every `minigpt_jax.x.y` on the pages and in the README, and of
    every backticked `a.b` whose first part is a module or package of the library or the apps
    (`data.formats.DATA_FORMATS`, `model.gpt.init_cache`)."""
    found = {}
    for page in [README, *PAGES]:
        text = page_text(page)
        where = str(page.relative_to(REPO))
        for name in re.findall(r"\b(minigpt_(?:jax|apps)(?:\.\w+)+)", text):
            found.setdefault(name.rstrip("."), where)
        for code in re.findall(r"`([^`\n]+)`", text):
            for name in re.findall(r"(?<![\w./:-])([a-z_]\w*(?:\.\w+)+)", code):
                if name.split(".")[0] in MODULE_NAMES and not name.startswith("minigpt_"):
                    if name.rsplit(".", 1)[1] not in FILE_SUFFIXES:
                        found.setdefault(name, where)
    return found


def test_every_dotted_name_the_pages_mention_imports():
    """No page names a module or attribute that does not exist (issue 50: extending.md named
    data.storage.DATA_FORMATS after the module had gone). A short name is looked up under the
    package and each subpackage; a two-part name whose head is a config group may be a config
    key (`model.block`, `data.path`)."""
    keys = _config_keys()
    wrong = {}
    for name, page in sorted(mentioned_names().items()):
        if name in NOT_PYTHON:
            continue
        if name in GONE:
            assert not _resolves(name), f"{name} is named as gone but imports"
            continue
        roots = ["", "minigpt_jax.", *(f"{p}." for p in PACKAGES)]
        if any(_resolves(root + name) for root in roots):
            continue
        group, _, key = name.removeprefix("config.").rpartition(".")
        if name.startswith("config.") and (key in keys.get(group, ()) or not group and key in keys):
            continue  # the ConfigDict's `config.seed`, `config.data`, `config.data.path`
        if "." not in group and key in keys.get(group, ()):
            continue
        wrong[name] = page
    assert wrong == {}, f"names the pages mention that do not import: {wrong}"


def test_every_page_the_code_names_exists():
    """Messages and docstrings send readers to pages (`docs/extending/model.md, 'A gated
    MLP'`): each page the library, the apps, the configs and the tests name exists."""
    named = {}
    for root in ("minigpt_jax", "minigpt_apps", "configs", "tests", "benchmarks", "experiments"):
        for path in sorted((REPO / root).rglob("*.py")):
            for page in re.findall(r"\bdocs/[\w/-]+\.md\b", path.read_text(encoding="utf-8")):
                named.setdefault(page, str(path.relative_to(REPO)))
    assert "docs/extending/model.md" in named, named
    missing = {page: where for page, where in named.items() if not (REPO / page).is_file()}
    assert missing == {}, f"pages named that do not exist: {missing}"


# ----------------------------------------------------------------------------- API reference


def reference_targets() -> set[str]:
    """The `::: name` of every API reference page, as full import paths of their objects."""
    targets = set()
    for page in sorted((REPO / "docs" / "reference").glob("*.md")):
        targets |= set(re.findall(r"^::: ([\w.]+)$", page_text(page), re.M))
    return targets


def _canonical(dotted: str) -> str:
    import importlib

    module, _, name = dotted.rpartition(".")
    obj = getattr(importlib.import_module(module), name)
    return f"{getattr(obj, '__module__', module)}.{getattr(obj, '__qualname__', name)}"


def test_the_api_reference_lists_every_public_name():
    """Every name `from minigpt_jax import X` gives (`__all__`), every function of
    docs/api.md's table, and the names issue 50 lists, have an entry in docs/reference/."""
    listed = {_canonical(t) for t in reference_targets() if _resolves(t)}
    assert len(listed) == len(reference_targets()), "a ::: target does not import"
    public = {f"minigpt_jax.{name}" for name in minigpt_jax.__all__}
    api = page_text(REPO / "docs" / "api.md")
    table = re.findall(r"^\| [^|]+ \| `([\w.]+)\(", api, re.M)
    assert len(table) >= 9, table
    public |= {f"minigpt_jax.{name}" for name in table}
    public |= {
        "minigpt_jax.train.step.train_step",
        "minigpt_jax.settings.declares",
        "minigpt_jax.settings.setting",
        "minigpt_jax.settings.options_of",
        "minigpt_jax.settings.Registry",
        "minigpt_jax.data.tokenizers.load_gpt2_tokenizer",
        "minigpt_jax.sampling.texts.sample_texts",
    }
    missing = sorted(name for name in public if _canonical(name) not in listed)
    assert missing == [], f"public names without an API reference entry: {missing}"


# ---------------------------------------------------------------------------- README commands


def readme_commands() -> list[str]:
    """The commands of the README's first ```bash block, comments dropped."""
    block = page_text(README).split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readme_is_a_map():
    """Issue 50: at most 250 lines; its first 40 say what it is, install, train with the
    expected result, sample, test, and list the core's files."""
    text = page_text(README)
    assert len(text.splitlines()) <= 250
    first = "\n".join(text.splitlines()[:40])
    for needed in ("pip install", "minigpt-jax train", "minigpt-jax sample", "pytest", "val loss"):
        assert needed in first, needed
    assert "## The core" in first and "minigpt_jax/train/step.py` (" in text


def test_the_readmes_links_reach_files_and_headings():
    """The README is read on GitHub, outside the site's build: each relative link names a file
    of the repository, and each #anchor a heading of that page."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#([\w-]+))?\)", page_text(README))
    assert len(links) >= 10, links
    for path, anchor in links:
        if path.startswith("http"):
            continue
        target = REPO / path
        assert target.is_file(), path
        if anchor:
            headings = re.findall(r"^#+ (.+)$", page_text(target), re.M)
            slugs = {re.sub(r"[^\w]+", "-", h.lower()).strip("-") for h in headings}
            assert anchor in slugs, (path, anchor)


def test_the_readmes_install_and_test_commands_are_cis():
    """.ci/run installs at least the README's extras and runs the README's test command."""
    install, *_, tests = readme_commands()
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    [ci_install] = [line for line in ci if "pip install" in line and " -e " in line]
    extras = lambda command: set(re.search(r"\.\[([\w,]+)\]", command).group(1).split(","))  # noqa: E731
    assert install.split("'")[0] == ci_install.split("'")[0].replace(" --quiet", "")
    assert extras(install) <= extras(ci_install)
    assert tests.startswith("python -m pytest") and any(line.startswith(tests) for line in ci)


@pytest.mark.slow
def test_the_readmes_train_and_sample_commands_run_as_written(tmp_path):
    """The main job as the README writes it (1,500 steps: about 100-250 s on the 2-core
    development machines), its stated result (val loss 3.09), then the README's sample
    command on that run."""
    _, train, sample, _ = readme_commands()
    (tmp_path / "configs").symlink_to(REPO / "configs")
    result = _run(shlex.split(train), tmp_path, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    final = re.findall(r"step 1500: train loss (\d+\.\d+), val loss (\d+\.\d+)", result.stdout)
    assert final, result.stdout[-2000:]
    assert abs(float(final[-1][1]) - 3.09) < 0.01, final
    result = _run(shlex.split(sample), tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("The ") and len(result.stdout) > 100, result.stdout


# ------------------------------------------------------------------------------------ the site

# Any fetch from the network during the build goes to a closed port and fails.
OFFLINE = {k: "http://127.0.0.1:9" for k in ("http_proxy", "https_proxy")}
OFFLINE |= {k.upper(): v for k, v in OFFLINE.items()}
SHOTS = Path(os.environ.get("DOCS_SCREENSHOTS", "/tmp/docs-shots"))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built as `mkdocs build --strict` builds it (about 15 s alone on the 2-core
    development machine), offline."""
    out = tmp_path_factory.mktemp("site")
    args = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    result = _run(args, REPO, timeout=600, NO_MKDOCS_2_WARNING="1", **OFFLINE)
    assert result.returncode == 0, result.stderr[-5000:]
    return out


@pytest.mark.slow
def test_the_site_builds_strict_and_offline(site):
    """Every page of mkdocs.yml's nav is built, with every link, anchor and `::: name` resolved
    (--strict: a warning fails the build), and no page loads anything from another host."""
    pages = sorted(site.rglob("index.html"))
    assert len(pages) == len(PAGES), (pages, PAGES)  # one a markdown file of docs/
    external = re.compile(r"""<(?:link|script|img)\b[^>]*(?:href|src)=["']?(?:https?:)?//""")
    loads = {str(p.relative_to(site)) for p in pages if external.search(p.read_text())}
    assert loads == set(), f"pages that load from another host: {loads}"
    settings = (site / "configs" / "index.html").read_text()
    assert "<code>num_steps</code>" in settings and "<code>attention_mask</code>" in settings
    model = (site / "reference" / "model" / "index.html").read_text()
    assert 'id="minigpt_jax.GPTConfig"' in model and 'id="minigpt_jax.forward"' in model


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = Path("/usr/bin/chromium")
    chromedriver = Path("/usr/bin/chromedriver")
    if not (chromium.is_file() and chromedriver.is_file()):
        pytest.skip("Debian's Chromium is missing: apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--window-size=1280,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(chromedriver)), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on a free local port, as `mkdocs serve` shows it."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    server = subprocess.Popen(args, cwd=site, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import time
        import urllib.request

        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.parametrize(
    "path, title, heading",
    [
        ("", "minigpt-jax", "minigpt-jax"),
        ("reference/model/", "Model - minigpt-jax", "Model"),
    ],
)
def test_the_pages_render_in_chromium(browser, served, path, title, heading):
    """The home page and an API page in Chromium: the title, the navigation with every section,
    the page's heading, and no markdown left raw (fences, `:::`, `--8<--`, link syntax);
    the screenshots go to $DOCS_SCREENSHOTS (default /tmp/docs-shots)."""
    from selenium.webdriver.common.by import By

    browser.get(f"{served}/{path}")
    assert browser.title == title
    nav = browser.find_element(By.CSS_SELECTOR, "nav.md-nav--primary")
    for section in ("Getting started", "Extending", "API reference", "Layout and layers"):
        assert section in nav.get_attribute("textContent"), section
    article = browser.find_element(By.CSS_SELECTOR, "article.md-content__inner")
    assert article.find_element(By.TAG_NAME, "h1").text.startswith(heading)
    text = article.text
    for raw in ("```", "::: ", "--8<--", "](", "<!--"):
        assert raw not in text, raw
    if path:
        assert len(article.find_elements(By.CSS_SELECTOR, "div.doc-object")) >= 10
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / f"{path.strip('/').replace('/', '_') or 'home'}.png"))
