"""JupyterLab as a user meets it, in a real browser: `make lab`'s own command (as root it adds --allow-root)
serves the repository root; headless Chromium, driven by selenium, opens every notebook and finds the kernel
the notebooks name, their figures drawn, no error or stderr output and no modified mark; then it runs a smoke
notebook to its end through the menus, some of its cells run again after the end (as a reader does), which
leave its claims those of one clean run. Screenshots go to out/browser/. Where no browser can be installed,
this fails saying what to install: it never skips."""
import copy
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from specdec_lite import paths, sweep
from specdec_lite.repro.endpoints import free_port

ROOT = paths.repo_root()
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
SHOTS = ROOT / "out" / "browser"
SMOKE_NOTEBOOK = "01_unbiasedness"
SHOW_CSV = "print(open(run.results / 'claims_01_unbiasedness.csv').read())"  # its claims, as its CSV holds them
TOKEN = "specdec-lite-browser-test"
LAB_SETTINGS = {  # the test's own JupyterLab settings: every cell in the page, nothing saved behind its back
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
}
CURRENT = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook in front: a page may hold others, hidden
CURRENT_TAB = ".lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-current"
STDERR = '[data-mime-type="application/vnd.jupyter.stderr"]'
WIDGET = '[data-mime-type="application/vnd.jupyter.widget-view+json"]'  # a saved notebook shows these as placeholders


def browser_binaries() -> tuple[str, str]:
    """(chromium, chromedriver), or a failure that says what to install."""
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (the test extra: pip install -e '.[test]', which make test does)")
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        missing.append("chromium and chromedriver (apt-get install chromium chromium-driver; make test does it "
                       "when run as root on Debian)")
    if missing:
        pytest.fail("the browser test needs " + " and ".join(missing), pytrace=False)
    return chromium, driver


def lab_command(port: int, settings: Path) -> list[str]:
    """The command `make lab` runs, with the test's options passed through LAB_ARGS."""
    options = (f"--no-browser --port={port} --ServerApp.token={TOKEN} --LabApp.user_settings_dir={settings} "
               f"--LabApp.workspaces_dir={settings / 'workspaces'}")
    printed = subprocess.run(["make", "-s", "-n", "lab", f"VENV={sys.prefix}", f"LAB_ARGS={options}"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    [line] = [line for line in printed.splitlines() if " lab " in line and "jupyter" in line]
    return shlex.split(line)


def tracked_notebooks_digest() -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in NOTEBOOKS}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab started by `make lab`'s command at the repository root, kernels in smoke mode; its URL."""
    browser_binaries()
    settings = tmp_path_factory.mktemp("lab-settings")
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    port = free_port()
    env = {**os.environ, "SPECDEC_SMOKE": "1", "SPECDEC_PUBLISH": "0"}
    command = lab_command(port, settings)
    if os.getuid() == 0:
        assert "--allow-root" in command, command
    log = (tmp_path_factory.mktemp("lab-log") / "lab.log").open("w")
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    before = tracked_notebooks_digest()
    try:
        wait_for(lambda: answers(f"{url}/api/status?token={TOKEN}") or server.poll() is not None, 120, "JupyterLab")
        assert server.poll() is None, f"`make lab` did not start: {Path(log.name).read_text()[-2000:]}"
        yield url
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    assert tracked_notebooks_digest() == before, "the browser session changed a tracked notebook"


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = browser_binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    with webdriver.Chrome(service=Service(driver), options=options) as chrome:
        yield chrome


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"waited {seconds:.0f} s for {what}")


def open_in_lab(browser, url: str, relative: str):
    """Open ``relative`` (from the repository root) in a workspace of its own, so that no notebook opened before
    is restored beside it, and wait until it is in front with its cells and its kernel is idle."""
    from selenium.webdriver.common.by import By

    name = Path(relative).name
    browser.get(f"{url}/lab/workspaces/{Path(relative).stem}/tree/{relative}?reset&token={TOKEN}")
    wait_for(lambda: current_tab(browser) == name and browser.find_elements(By.CSS_SELECTOR, f"{CURRENT} .jp-Cell"),
             90, f"{relative} to open")
    try:
        wait_for(lambda: kernel_status(browser) == "idle", 120, f"the kernel of {relative}")
    except AssertionError as error:
        raise AssertionError(f"{error}; its kernel shows {kernel_status(browser)!r}, the tab in front is "
                             f"{current_tab(browser)!r}") from None


def current_tab(browser) -> str:
    from selenium.webdriver.common.by import By

    found = browser.find_elements(By.CSS_SELECTOR, f"{CURRENT_TAB} .lm-TabBar-tabLabel")
    return found[0].text if found else ""


def kernel_status(browser) -> str:
    from selenium.webdriver.common.by import By

    found = browser.find_elements(By.CSS_SELECTOR, f"{CURRENT} .jp-Notebook-ExecutionIndicator")
    return found[0].get_attribute("data-status") if found else ""


def shut_down_kernels(url: str) -> None:
    with urllib.request.urlopen(f"{url}/api/sessions?token={TOKEN}") as reply:
        sessions = json.load(reply)
    for session in sessions:
        request = urllib.request.Request(f"{url}/api/sessions/{session['id']}?token={TOKEN}", method="DELETE")
        urllib.request.urlopen(request).close()


def page_state(browser) -> dict:
    """What the open notebook shows: kernel name, images (and how many drew), error and stderr outputs, widget
    outputs, whether its tab carries the modified mark, the input prompts."""
    return browser.execute_script(f"""
        const panel = document.querySelector('{CURRENT}');
        const images = [...panel.querySelectorAll('.jp-RenderedImage img')];
        const tab = document.querySelector('{CURRENT_TAB}');
        const kernel = panel.querySelector('[data-jp-item-name="kernelName"]');
        return {{
            kernel: kernel ? kernel.textContent.trim() : '',
            images: images.length,
            drawn: images.filter(i => i.complete && i.naturalWidth > 0).length,
            stderr: [...panel.querySelectorAll('{STDERR}')].map(e => e.textContent.slice(0, 300)),
            widgets: panel.querySelectorAll('{WIDGET}').length,
            modified: tab ? tab.classList.contains('jp-mod-dirty') : null,
            prompts: [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim()),
        }};""")


def stored_images(path: Path) -> int:
    nb = json.loads(path.read_text())
    return sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))


def test_lab_opens_at_the_repository_root(lab, browser):
    from selenium.webdriver.common.by import By

    browser.get(f"{lab}/lab?reset&token={TOKEN}")
    listed = wait_for(lambda: [e.get_attribute("textContent") for e in
                               browser.find_elements(By.CSS_SELECTOR, ".jp-DirListing-itemText")],
                      90, "the file browser")
    assert {"notebooks", "docs", "figures", "README.md"} <= set(listed), listed


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_opens_as_it_was_saved(lab, browser, path):
    try:
        open_in_lab(browser, lab, f"notebooks/{path.name}")
        time.sleep(2)  # anything that would mark the notebook modified has happened by now
        state = page_state(browser)
    finally:
        shut_down_kernels(lab)  # a failure here leaves no kernel behind for the next notebook
    assert state["kernel"] == sweep.KERNEL_DISPLAY_NAME, state
    assert state["images"] == stored_images(path) and state["drawn"] == state["images"], state
    assert not state["stderr"] and not state["widgets"], state
    assert state["modified"] is False, f"{path.name} shows as modified right after opening"


def test_a_smoke_notebook_runs_to_its_end_through_the_menus_and_cells_run_again_keep_its_claims(lab, browser):
    """The smoke notebook, outputs cleared, copied under out/browser/ (nothing tracked is touched) and run with
    Run > Run All Cells; screenshots of its top and of its end. After its own cells, the copy shows its claims'
    CSV, runs again the set-up cell, a claim cell twice, another claim cell and the last cell, and shows the CSV
    again: a claim cell run again replaces its row (one row per check, the last one wins) and the set-up cell run
    again keeps the rows, so the CSV is the clean run's."""
    from selenium.webdriver.common.by import By

    SHOTS.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(ROOT / "notebooks" / f"{SMOKE_NOTEBOOK}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        cell.outputs, cell.execution_count = [], None
    again = [cell_with(code, "run = setup("), cell_with(code, "c4_round_bounds"), cell_with(code, "c17_truncation"),
             cell_with(code, "c4_round_bounds"), code[-1]]
    show = nbformat.v4.new_code_cell(SHOW_CSV)
    repeated = [copy.deepcopy(cell) for cell in [*again, show]]
    for i, cell in enumerate(repeated):
        cell.id = f"run-again-{i}"  # a copy's id is its original's, which a notebook may not hold twice
    nb.cells += [show, *repeated]
    path = SHOTS / f"{SMOKE_NOTEBOOK}.ipynb"
    path.write_text(sweep.jupyterlab_form(nbformat.writes(nb)))
    open_in_lab(browser, lab, path.relative_to(ROOT).as_posix())
    browser.save_screenshot(str(SHOTS / f"{SMOKE_NOTEBOOK}_top.png"))
    start = time.monotonic()
    click_menu(browser, "Run", "runmenu:run-all")
    code_cells = sum(c.cell_type == "code" for c in nb.cells)

    def finished():
        state = page_state(browser)
        assert not state["stderr"], state["stderr"]
        done = [p for p in state["prompts"] if p.strip("[]:").isdigit()]
        return len(done) == code_cells and kernel_status(browser) == "idle" and state

    state = wait_for(finished, 600, f"{SMOKE_NOTEBOOK} to run to its end")
    seconds = time.monotonic() - start
    cells = browser.find_elements(By.CSS_SELECTOR, f"{CURRENT} .jp-CodeCell")
    last = cells[len(code) - 1]  # the notebook's own last cell
    browser.execute_script("arguments[0].scrollIntoView(false);", last)
    time.sleep(1)
    browser.save_screenshot(str(SHOTS / f"{SMOKE_NOTEBOOK}_smoke_end.png"))
    outputs = [cell.find_element(By.CSS_SELECTOR, ".jp-OutputArea").text for cell in cells]
    shut_down_kernels(lab)
    print(f"{SMOKE_NOTEBOOK} ran in smoke mode through the menus in {seconds:.0f} s; screenshots in "
          f"{SHOTS.relative_to(ROOT)}/")
    assert "C22" in last.text and "C1" in last.text and state["drawn"] == state["images"] > 0, last.text
    assert not state["widgets"], "progress shown as widgets: a saved notebook would show placeholders"
    assert "smoke: True (SPECDEC_SMOKE=1)" in browser.find_element(By.CSS_SELECTOR, CURRENT).text
    clean, rerun = outputs[len(code)], outputs[-1]
    assert rerun == clean, (clean, rerun)
    rows = [line.split(",")[:2] for line in clean.strip().splitlines()[1:]]
    assert [claim for claim, _ in rows] == ["C1", "C2", "C3", "C4", "C16", "C17", "C22", "C1"], clean
    assert "C4" in outputs[-2]  # the last cell, run again, shows the claims


def cell_with(cells, text: str):
    [found] = [c for c in cells if text in c.source]
    return found


def click_menu(browser, menu: str, command: str) -> None:
    from selenium.webdriver.common.by import By

    [item] = [e for e in browser.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel") if e.text == menu]
    item.click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'.lm-Menu-item[data-command="{command}"]'), 10,
             f"the {menu} menu")[0].click()
