"""The lab page's response times and its server's memory, measured in headless Chromium.

    python -m benchmarks.lab_page                 # timings, then RSS over 1,000 events
    python -m benchmarks.lab_page --events 200    # a shorter memory run

Starts `python -m minigpt_jax lab` on a free port and drives it as a learner would (Debian's
chromium and chromium-driver, through Selenium). Each figure is from a click to the moment the
page shows the result: one training step, runs of 5, 10, 100 and 500 steps, one slider move,
a lookup in a second browser while the first runs 500 steps, and Stop during a run. Then it
sends --events events (steps, lookups with varying ids, slider moves, sentences, positions,
resets), waiting for each, and prints the server's resident memory (VmRSS of its process)
every 100 events.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
print = functools.partial(print, flush=True)  # noqa: A001 - each figure as it is measured


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _start_server(log_path: Path) -> tuple[subprocess.Popen, str]:
    from minigpt_apps.lab.app import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = open(log_path, "w")  # noqa: SIM115 - the server writes to it until it stops
    process = subprocess.Popen(
        [sys.executable, "-m", "minigpt_jax", "lab", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while f"minigpt-jax lab: {url}" not in log_path.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the lab did not start:\n{log_path.read_text()}")
        time.sleep(0.5)
    return process, url


def _driver(profile: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    service = Service(shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_window_size(1400, 2400)
    return driver


class Tab:
    def __init__(self, driver, url: str):
        from selenium.webdriver.common.by import By

        self.driver, self.by = driver, By
        driver.get(url)
        driver.execute_script("window.localStorage.clear();")
        driver.get(url)
        self.until(lambda: "article's table" in self.text("table-message"))

    def text(self, elem_id: str) -> str:
        from selenium.common.exceptions import WebDriverException

        try:
            return self.driver.find_element(self.by.ID, elem_id).text
        except WebDriverException:  # not on the page yet, or being replaced
            return ""

    def until(self, condition, timeout: float = 120) -> float:
        started = time.perf_counter()
        while not condition():
            if time.perf_counter() - started > timeout:
                shown = self.text("step-message") or self.text("table-message")
                raise TimeoutError(f"the page did not answer in time; it shows: {shown!r}")
            time.sleep(0.01)
        return time.perf_counter() - started

    def type(self, elem_id: str, value: str) -> None:
        from selenium.webdriver.common.keys import Keys

        field = self.driver.find_element(
            self.by.CSS_SELECTOR, f"#{elem_id} input, #{elem_id} textarea"
        )
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.DELETE)
        field.send_keys(value)

    def click(self, elem_id: str) -> float:
        """Seconds from the click until its part's message or result changes."""
        part = elem_id.split("-")[0]
        part = "step" if part in ("reset", "steps", "stop") else part
        before = (self.text(f"{part}-message"), self.text(f"{part}-result"))
        started = time.perf_counter()
        self.driver.execute_script(f"document.getElementById('{elem_id}').click();")
        self.until(lambda: (self.text(f"{part}-message"), self.text(f"{part}-result")) != before)
        return time.perf_counter() - started

    def steps(self, n: int) -> float:
        """Seconds from clicking "Take N steps" until the page says the run is done."""
        self.type("step-n", str(n))
        started = time.perf_counter()
        self.driver.execute_script("document.getElementById('steps-button').click();")
        self.until(lambda: f"Done: {n} of {n} steps." in self.text("step-message"))
        return time.perf_counter() - started


# The slider's keys and the moments the shared table and part 3's table show a new value (the
# fingerprint data-w of their views), on the page's clock: Selenium's polling is not counted.
_LOG_SLIDER = """
    const s = window.labSlider = {keys: [], shown: [], part: []};
    document.addEventListener('keydown', () => s.keys.push(performance.now()), true);
    const watch = (id, list) => {
      let last = document.querySelector(`#${id} .lab-view`).dataset.w;
      new MutationObserver(() => {
        const w = document.querySelector(`#${id} .lab-view`)?.dataset.w;
        if (w && w !== last) { last = w; list.push(performance.now()); }
      }).observe(document.getElementById(id),
                 {subtree: true, childList: true, attributes: true, attributeFilter: ['data-w']});
    };
    watch('table', s.shown);
    watch('edit-result', s.part);"""


def timings(driver, url: str) -> None:
    tab = Tab(driver, url)
    step = []
    for _ in range(6):
        started = time.perf_counter()
        count = tab.text("step-result").split("Steps taken on this table: ")[1].split(".")[0]
        driver.execute_script("document.getElementById('step-button').click();")
        tab.until(
            lambda c=count: f"Steps taken on this table: {int(c) + 1}." in tab.text("step-result")
        )
        step.append(time.perf_counter() - started)
    print(f"one step, click to figures: median {statistics.median(step[1:]):.2f} s "
          f"(runs: {', '.join(f'{s:.2f}' for s in step)}; the first compiles)")  # fmt: skip
    tab.click("reset-button")
    for n in (5, 10, 100, 500):
        print(f"{n:>3} steps, click to done: {tab.steps(n):.2f} s")
        tab.click("reset-button")
    from selenium.webdriver.common.keys import Keys

    slider = driver.find_element(tab.by.CSS_SELECTOR, "#edit-slider input[type=range]")
    driver.execute_script(_LOG_SLIDER)
    moves, polled = [], []
    count = "const s = window.labSlider; return Math.min(s.shown.length, s.part.length);"
    last = "const s = window.labSlider; return [s.keys.at(-1), s.shown.at(-1), s.part.at(-1)];"
    for k in range(7):
        shown = driver.execute_script(count)
        started = time.perf_counter()
        slider.send_keys(Keys.ARROW_RIGHT if k % 2 == 0 else Keys.ARROW_LEFT)
        tab.until(lambda n=shown: driver.execute_script(count) > n)
        polled.append(time.perf_counter() - started)
        key, table, part = driver.execute_script(last)
        moves.append(((table - key) / 1e3, (part - key) / 1e3))
        time.sleep(0.5)  # one key at a time: a learner reading the table
    print(f"slider move, key to table: median {statistics.median(t for t, _ in moves):.2f} s, "
          f"to part 3's table {statistics.median(p for _, p in moves):.2f} s (the page's clock: "
          f"keydown to the new value in the DOM; {statistics.median(polled):.2f} s as Selenium "
          f"polls it; keys: {', '.join(f'{t:.2f}' for t, _ in moves)})")  # fmt: skip
    # Another user's lookup while this tab runs 500 steps, and Stop during a run. Both pages
    # log their parts' changes with Date.now() (one clock for both browsers), so the figures do
    # not depend on how fast Selenium polls; Stop is clicked by the page itself on its first
    # "Training:" frame.
    log_changes = """
        window.labLog = [];
        for (const id of arguments[0]) {
          const part = document.getElementById(id);
          new MutationObserver(() => {
            const text = part.innerText;
            window.labLog.push([Date.now(), id, text]);
            if (window.labStopOnTraining && text.includes('Training:') && !window.labStopAt) {
              window.labStopAt = Date.now();
              document.getElementById('stop-button').click();
            }
          }).observe(part, {subtree: true, childList: true, characterData: true});
        }"""
    other_driver = _driver(tempfile.mkdtemp(prefix="lab-other-"))
    try:
        other = Tab(other_driver, url)
        other.type("lookup-ids", "[2, 2, 1]")
        other_driver.execute_script(log_changes, ["lookup-result"])
        driver.execute_script(log_changes, ["step-message"])
        run_clicked = driver.execute_script(
            "document.getElementById('steps-button').click(); return Date.now();"
        )
        clicked = other_driver.execute_script(
            "document.getElementById('lookup-button').click(); return Date.now();"
        )
        tab.until(lambda: "Done" in tab.text("step-message"))
        other.until(lambda: other_driver.execute_script("return window.labLog.length;") > 0)
        answered = other_driver.execute_script("return window.labLog[0][0];")
        run = driver.execute_script("return window.labLog;")
        done = next(t for t, _, text in run if "Done" in text)
        during = run_clicked <= clicked and answered <= done
        print(f"another user's lookup during a 500-step run: {(answered - clicked) / 1e3:.2f} s "
              f"(clicked {(clicked - run_clicked) / 1e3:.2f} s after the run; the run done "
              f"{(done - answered) / 1e3:.2f} s after the lookup answered: "
              f"{'during' if during else 'NOT during'} the run)")  # fmt: skip
    finally:
        other_driver.quit()
    stops = []
    for _ in range(3):
        tab.click("reset-button")
        driver.execute_script(log_changes, ["step-message"])
        driver.execute_script("window.labStopAt = 0; window.labStopOnTraining = true;")
        driver.execute_script("document.getElementById('steps-button').click();")
        tab.until(lambda: "Stopped after" in tab.text("step-message")
                  or "Done" in tab.text("step-message"))  # fmt: skip
        stop_at = driver.execute_script("return window.labStopAt;")
        run = driver.execute_script("return window.labLog;")
        end_at, end_text = next((t, x) for t, _, x in run if "Stopped" in x or "Done" in x)
        stops.append(f"{(end_at - stop_at) / 1e3:.2f} s ({end_text})" if stop_at else end_text)
    driver.execute_script("window.labStopOnTraining = false;")
    print("Stop on a run's first frame, click to stopped: " + "; ".join(stops))


def memory(driver, url: str, pid: int, events: int) -> None:
    from selenium.webdriver.common.keys import Keys

    tab = Tab(driver, url)
    slider = driver.find_element(tab.by.CSS_SELECTOR, "#edit-slider input[type=range]")
    print(f"RSS after load: {_rss_mb(pid):.0f} MB")
    started = time.perf_counter()
    for k in range(1, events + 1):
        kind = k % 6
        if kind == 0:
            tab.click("step-button")
        elif kind == 1:
            tab.type("lookup-ids", str([k % 6, k % 5]))  # never the ids of the last lookup
            tab.click("lookup-button")
        elif kind == 2:
            before = tab.text("table")
            slider.send_keys(Keys.ARROW_RIGHT if k % 4 else Keys.ARROW_LEFT)
            tab.until(lambda b=before: tab.text("table") != b)
        elif kind == 3:
            words = ["oto", "kamienny", "metalowy", "drzwi"]
            tab.type("context-b", " ".join(words[: 1 + k % 4] + ["zamek"]))
            tab.click("context-button")
        elif kind == 4:
            tab.type("positions-pos", str(k % 60))
            tab.click("positions-button")
        elif k % 60 == 5:  # after a step: the reset changes the page
            tab.click("reset-button")
        else:
            tab.type("lookup-ids", str([k % 6, k % 5]))
            tab.click("lookup-button")
        if k % 100 == 0:
            print(f"RSS after {k:>5} events: {_rss_mb(pid):.0f} MB "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--skip_timings", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        process, url = _start_server(Path(tmp) / "lab.log")
        driver = _driver(str(Path(tmp) / "profile"))
        try:
            print(f"server RSS at start: {_rss_mb(process.pid):.0f} MB", flush=True)
            if not args.skip_timings:
                timings(driver, url)
            if args.events:
                memory(driver, url, process.pid, args.events)
        finally:
            driver.quit()
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
