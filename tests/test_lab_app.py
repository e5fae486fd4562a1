"""The lab page end to end: `python -m minigpt_jax lab` driven in headless Debian Chromium."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from minigpt_jax.lab import app
from minigpt_jax.lab.text import TEXT

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
START_TIMEOUT_S = 120
WAIT_S = 30


def test_handlers_keep_the_state_and_explain_bad_input():
    """Without a browser: a bad learning rate leaves state and result alone and says why."""
    import gradio as gr

    state = app.initial_state()
    step = app._guarded("en", 3)(lambda s, lr: app.step_part(s, lr, "en"))
    new_state, _, result, error = step(state, "0.4")
    assert new_state.steps == 1 and "61.0%" in result and "0.495" in result and error == ""
    *kept, error = step(new_state, "abc")
    assert all(isinstance(value, type(gr.skip())) for value in kept)
    assert "learning rate: “abc” is not a number" in error
    *_, error_es = app._guarded("es", 3)(lambda s, lr: app.step_part(s, lr, "es"))(state, "inf")
    assert "tasa de aprendizaje: inf no es un número finito" in error_es


def test_the_spanish_page_has_only_spanish_words():
    """Every label and button of --lang es comes from the Spanish words, none from the English."""
    config = json.dumps(app.build("es").get_config_file(), ensure_ascii=False, default=str)
    for key in ("step_button", "rename_button", "equal_button", "lookup_ids", "context_heading"):
        assert TEXT["es"][key] in config and TEXT["en"][key] not in config, key


@pytest.fixture(scope="module")
def lab_url(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("lab") / "lab.log"
    port = app.free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "minigpt_jax", "lab", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        # The lab prints its URL once the server listens.
        while f"minigpt-jax lab: {url}" not in log_path.read_text():
            if process.poll() is not None:
                pytest.fail(f"the lab exited with {process.returncode}:\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no URL within {START_TIMEOUT_S} s:\n{log_path.read_text()}")
            time.sleep(0.5)
        assert b"<html" in urllib.request.urlopen(url, timeout=30).read()
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
        pytest.skip(
            f"Debian's Chromium is not installed ({CHROMIUM}, {CHROMEDRIVER} missing): "
            "apt-get install -y chromium chromium-driver"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1800",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


class Page:
    """The lab page in the browser: fields, buttons and outputs by their elem_id."""

    def __init__(self, driver, url, shots: Path):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver, self.by, self.shots = driver, By, shots
        self.wait = WebDriverWait(driver, WAIT_S)
        driver.get(url)
        self.wait_for("lookup-result", "one-hot")

    def text(self, elem_id: str) -> str:
        return self.driver.find_element(self.by.ID, elem_id).text

    def type(self, elem_id: str, value: str) -> None:
        from selenium.webdriver.common.keys import Keys

        field = self.driver.find_element(
            self.by.CSS_SELECTOR, f"#{elem_id} textarea, #{elem_id} input"
        )
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(value)

    def click(self, elem_id: str) -> None:
        button = self.driver.find_element(self.by.ID, elem_id)
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", button)
        button.click()

    def choose(self, elem_id: str, label: str) -> None:
        self.driver.find_element(
            self.by.XPATH, f"//*[@id='{elem_id}']//label[contains(., '{label}')]"
        ).click()

    def wait_for(self, elem_id: str, *needles: str) -> str:
        """The element's text once it holds every needle (fails after WAIT_S with the text)."""
        try:
            self.wait.until(lambda _: all(n in self.text(elem_id) for n in needles))
        except Exception:
            pytest.fail(f"#{elem_id} never showed {needles}; it shows:\n{self.text(elem_id)}")
        return self.text(elem_id)

    def inner_text(self, selector: str) -> str:
        """Text of an element inside a part's output (Gradio's loading overlay is outside it)."""
        return self.driver.find_element(self.by.CSS_SELECTOR, selector).text

    def wait_for_exactly(self, selector: str, expected: str) -> None:
        try:
            self.wait.until(lambda _: self.inner_text(selector) == expected)
        except Exception:
            pytest.fail(f"{selector} changed to:\n{self.inner_text(selector)}\nfrom:\n{expected}")

    def screenshot(self, elem_id: str, name: str) -> Path:
        element = self.driver.find_element(self.by.ID, elem_id)
        self.driver.execute_script("arguments[0].scrollIntoView();", element)
        path = self.shots / f"{name}.png"
        assert element.screenshot(str(path)), path
        return path


@pytest.mark.slow
def test_the_lab_in_a_real_browser(lab_url, browser, tmp_path):
    """Every part clicked through: the article's figures, renaming, a bad id, the other parts."""
    page = Page(browser, lab_url, tmp_path)
    shots = []

    # 1. lookup: a repeated id reads the same row
    page.type("lookup-ids", "[0, 1, 0]")
    page.click("lookup-button")
    page.wait_for("lookup-result", "Id 0 (oto) repeats at positions 0, 2", "= 0: the lookup")
    shown = page.inner_text("#lookup-result .lab-side")
    shots.append(page.screenshot("part-lookup", "1_lookup"))
    # ... a bad id: a message, and the result stays
    page.type("lookup-ids", "[0, 9]")
    page.click("lookup-button")
    page.wait_for("lookup-message", "ids: id 9 is out of range; the table has rows 0 to 5")
    page.wait_for_exactly("#lookup-result .lab-side", shown)
    shots.append(page.screenshot("part-lookup", "1_lookup_bad_id"))

    # 2. rename: only the ids changes the result; ids and rows together leaves it unchanged
    page.choose("rename-mode", "only the ids")
    page.click("rename-button")
    page.wait_for("rename-result", "the result changed", "what-if")
    shots.append(page.screenshot("part-rename", "2_rename_ids_only"))
    page.choose("rename-mode", "ids and rows together")
    page.click("rename-button")
    page.wait_for("rename-result", "max |x_after − x_before| = 0: the result is unchanged")
    page.wait_for("table", "3 kamienny")  # the shared table uses the new ids
    shots.append(page.screenshot("part-rename", "2_rename"))

    # 4. one training step on the renamed table: the article's figures
    page.click("step-button")
    result = page.wait_for("step-result", "47.0%", "61.0%", "0.755", "0.495")
    assert "Rows changed by the step: 3 kamienny;" in result, result
    figures = page.inner_text("#step-figures")
    shots.append(page.screenshot("part-step", "4_step"))
    page.type("step-lr", "abc")
    page.click("step-button")
    page.wait_for("step-message", "learning rate: “abc” is not a number")
    page.wait_for_exactly("#step-figures", figures)
    page.type("step-lr", "0.4")
    page.click("step-button")
    page.wait_for("step-result", "Steps taken on this table: 2.", "61.0%")  # from 61.0% on
    page.click("reset-button")
    page.wait_for("table", "1 kamienny")

    # 3. edit a coordinate: only the occurrences of that id change
    page.click("edit-button")
    page.wait_for("edit-result", "+0.500 → +0.900", "changed: 1, 3", "max change 0")
    shots.append(page.screenshot("part-edit", "3_edit"))

    # 5. context: same input at zamek, different outputs; then equal sentences
    page.click("context-button")
    page.wait_for("context-result", "differ by max 0 (identical inputs)", "different outputs")
    shots.append(page.screenshot("part-context", "5_context"))
    page.click("equal-button")
    page.wait_for("context-result", "identical outputs")
    shots.append(page.screenshot("part-context", "5_context_equal"))

    # 6. positions
    page.type("positions-pos", "10")
    page.type("positions-pair", "0")
    page.click("positions-button")
    page.wait_for(
        "positions-result", "ω_0 = 1/10000^(2·0/16) = 1 rad", "PE(10, 0) = sin(10·ω) = -0.5440"
    )
    shots.append(page.screenshot("part-positions", "6_positions"))
    page.type("positions-dim", "15")
    page.click("positions-button")
    page.wait_for("positions-message", "width D: 15 is odd", "even width such as 16")
    page.wait_for("positions-result", "PE(10, 0)")

    for path in shots:
        assert path.stat().st_size > 10_000, path  # a real picture, not an empty element
