"""The notebooks as a user opens them: `downpour lab` (what `make lab` runs) serves them in JupyterLab,
and a headless Chromium driven by Playwright, as JupyterLab's own UI tests do, runs them.

Notebooks 00 and 01 are opened in the browser and run with the Run menu's "Run All Cells"; each must
finish with every code cell executed and no cell showing an error, 00 showing the engine table, 01 a
rendered figure. Then, in 01, a long training cell is started and the kernel interrupted from the
Kernel menu while it runs: the cell shows the KeyboardInterrupt, and the cells below, run from the
menu, run on restarted engines (new process ids) and train on them.

The notebooks run small: each is a copy in a temporary directory with a cell of small parameters
after its ``parameters`` cell (``downpour_lib.notebooks.inject_parameters``, as the headless runs of
tests/test_notebooks.py do); the committed notebooks are not touched. Jupyter's configuration, data,
runtime, settings and workspaces, and IPython's profiles, live in temporary directories too, and every
process the server started (kernels, controllers, mpiexec, engines) must be gone at the end.

The browser is the system's Chromium (Debian's ``chromium``): Playwright's own download is never used.
Without one the test skips, except where DOWNPOUR_REQUIRE_BROWSER=1 or CI=true (.ci/run installs
it), where a skip would hide a broken interactive path, so it fails.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
import warnings
from pathlib import Path

import nbformat
import psutil
import pytest
from conftest import BIN, ROOT, launch_env

from downpour_lib.notebooks import inject_parameters

REQUIRED = os.environ.get("DOWNPOUR_REQUIRE_BROWSER") == "1" or os.environ.get("CI") == "true"
NOTEBOOKS = {"00_cluster_quickstart": {"engines": 2},
             "01_train_sync_ps": {"engines": 2, "model": "mlp", "steps": 10, "eval_every": 5}}
KERNEL = "Python 3 (" + Path(BIN).parent.name + ")"  # the display name `downpour lab` installs
CELL_TIMEOUT_MS = 300_000  # a cluster's start under load; every wait still ends
# an error output: a traceback, or the one line a ConfigError shows (`ConfigError: steps=...`)
ERROR = re.compile(r"Traceback \(most recent call last\)|^\s*[\w.]*(Error|Exception|KeyboardInterrupt)\b",
                   re.M)


def chromium() -> str:
    for name in (os.environ.get("DOWNPOUR_CHROMIUM", ""), "chromium", "chromium-browser"):
        path = shutil.which(name) if name else None
        if path:
            return path
    unavailable("no Chromium on PATH (apt-get install chromium; or set DOWNPOUR_CHROMIUM)")


def unavailable(reason: str):
    if REQUIRED:
        pytest.fail(f"DOWNPOUR_REQUIRE_BROWSER=1 (or CI=true) but {reason}")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server started by `downpour lab` on a directory of small notebook copies."""

    def __init__(self, tmp: Path):
        self.tmp, self.dir = tmp, tmp / "notebooks"
        self.dir.mkdir()
        for name, parameters in NOTEBOOKS.items():
            nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
            nbformat.write(inject_parameters(nb, parameters), self.dir / f"{name}.ipynb")
        self.port, self.token = free_port(), secrets.token_hex(16)
        env = launch_env()
        for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                         ("JUPYTER_RUNTIME_DIR", "runtime"), ("JUPYTERLAB_SETTINGS_DIR", "settings"),
                         ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")):
            env[var] = str(tmp / sub)
        # no "get notified about Jupyter news?" box over the notebook (and no request for it)
        settings = tmp / "settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        self.log = tmp / "server.log"
        self.server = subprocess.Popen(
            [str(BIN / "downpour"), "lab", str(self.dir), "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={self.token}"],
            env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT, cwd=tmp)
        self.seen: dict[int, psutil.Process] = {}

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def wait_up(self, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.server.poll() is not None:
                pytest.fail(f"`downpour lab` exited with {self.server.returncode}:\n{self.tail()}")
            try:
                urllib.request.urlopen(self.url("api/status"), timeout=5).read()
                return
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer within {timeout_s:.0f} s:\n{self.tail()}")
                time.sleep(0.5)

    def connection_lost(self, dialog) -> None:
        warnings.warn(f"JupyterLab showed 'Server Connection Error' (closed; it reconnects); server "
                      f"alive: {self.server.poll() is None}; its log ends:\n{self.tail()[-1500:]}",
                      stacklevel=1)
        dialog.get_by_role("button", name="Close").click()

    def theme_failed(self, dialog) -> None:
        """Under load the theme's stylesheet once failed to load and JupyterLab's modal "Error
        Loading Theme" took every click until the timeout (both browser tests failed on it): a
        user presses OK and reloads the page, which loads the theme again; so does the test."""
        warnings.warn(f"JupyterLab showed 'Error Loading Theme' (OK, then reloaded): "
                      f"{dialog.inner_text()[:300]}", stacklevel=1)
        dialog.get_by_role("button", name="OK", exact=True).click()
        self.page.reload()
        self.page.locator(".jp-DirListing-item", has_text="01_train_sync_ps.ipynb").wait_for()

    def tail(self) -> str:
        return self.log.read_text()[-4000:]

    def remember_processes(self) -> None:
        """Everything the server has started so far (kernels and what they started: controllers,
        mpiexec, engines, their nannies), to check at the end that it is all gone."""
        for p in psutil.Process(self.server.pid).children(recursive=True):
            self.seen.setdefault(p.pid, p)

    def stop(self) -> list[str]:
        """Stop the server (its kernels, whose exit stops their clusters) and whatever the profile
        still records; returns the processes still alive after that, which are then killed."""
        from downpour_lib.cluster import stop_clusters

        self.remember_processes()
        try:  # as File > Shut Down would: the kernels first, each stopping its cluster as it exits
            request = urllib.request.Request(self.url("api/shutdown"), method="POST")
            urllib.request.urlopen(request, timeout=30).read()
        except OSError:
            self.server.terminate()
        try:
            self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        stop_clusters("local-mpi")
        alive = [p for p in self.seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        gone, alive = psutil.wait_procs(alive, timeout=30)
        stray = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in alive]
        for p in alive:
            p.kill()
        return stray


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    executable = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (pip install -e '.[test]')")
    server = Lab(tmp_path_factory.mktemp("lab"))
    stray = []
    try:
        server.wait_up()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(CELL_TIMEOUT_MS)
                # Under make test's load JupyterLab once lost a poll's connection to the server and
                # its modal "Server Connection Error" took every click until the timeout; it keeps
                # reconnecting, so a user closes the box and goes on: so does the test, with a warning
                lost = page.locator(".jp-Dialog", has_text="Server Connection Error")
                page.add_locator_handler(lost, lambda dialog: server.connection_lost(dialog))
                server.page = page
                no_theme = page.locator(".jp-Dialog", has_text="Error Loading Theme")
                page.add_locator_handler(no_theme, lambda dialog: server.theme_failed(dialog))
                page.goto(server.url("lab"))
                page.locator(".jp-DirListing-item", has_text="01_train_sync_ps.ipynb").wait_for()
                yield server
            finally:
                browser.close()
    finally:
        stray = server.stop()
    assert not stray, f"processes the notebooks started outlived the server: {stray}"


# -- what a user does and sees, through the DOM ----------------------------------------------------

NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"
CELLS_JS = """() => [...document.querySelectorAll('NOTEBOOK .jp-Cell.jp-CodeCell')].map(c => ({
    prompt: c.querySelector('.jp-InputPrompt').textContent,
    source: c.querySelector('.jp-InputArea-editor').textContent,
    outputs: [...c.querySelectorAll('.jp-OutputArea-output')].map(o => ({
        mime: o.getAttribute('data-mime-type'), text: o.textContent,
        images: o.querySelectorAll('img').length})),
    tables: [...c.querySelectorAll('.jp-OutputArea-output table.dataframe')].map(t => {
        const heads = [...t.querySelectorAll('thead th')].map(h => h.textContent.trim());
        return [...t.querySelectorAll('tbody tr')].map(r => Object.fromEntries(
            [...r.children].map((d, i) => [heads[i], d.textContent.trim()])));
    })}))""".replace("NOTEBOOK", NOTEBOOK)


def screenshot(lab: Lab, name: str) -> Path:
    path = lab.tmp / f"{name}.png"
    lab.page.screenshot(path=path, full_page=True)
    return path


def open_notebook(lab: Lab, name: str) -> None:
    """Double-click the notebook in the file browser, as a user does, and wait for its kernel."""
    page = lab.page
    page.locator(".jp-DirListing-item", has_text=f"{name}.ipynb").dblclick()
    page.locator(".lm-TabBar-tab.lm-mod-current", has_text=name).wait_for()
    # The kernel started and idle: the toolbar names it, the execution indicator says idle. Under
    # load the notebook can open before JupyterLab has listed the kernels; it then asks which
    # kernel to start, proposing the notebook's own: a user clicks Select.
    page.wait_for_function("""() => {
        if (document.querySelector('.jp-Dialog select')) return true;  // which kernel?
        const name = document.querySelector('NOTEBOOK .jp-KernelName');
        const state = document.querySelector('NOTEBOOK .jp-Notebook-ExecutionIndicator');
        return name && state && !/No Kernel|Unknown/.test(name.textContent)
            && state.getAttribute('data-status') === 'idle';
    }""".replace("NOTEBOOK", NOTEBOOK))
    dialog = page.locator(".jp-Dialog", has=page.locator("select"))
    if dialog.count():
        offered = dialog.locator("select option:checked").inner_text()
        assert offered == KERNEL, f"JupyterLab proposes the kernel {offered!r}, not {KERNEL!r}"
        dialog.get_by_role("button", name="Select", exact=True).click()
        page.locator(f"{NOTEBOOK} .jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for()
    kernel = page.locator(f"{NOTEBOOK} .jp-KernelName").inner_text()
    assert kernel == KERNEL, f"the notebook runs on {kernel!r}, not .venv's kernel {KERNEL!r}"


def menu(lab: Lab, top: str, item: str) -> None:
    page = lab.page
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).click()


def cells(lab: Lab) -> list[dict]:
    return lab.page.evaluate(CELLS_JS)


def errors(cell: dict) -> list[str]:
    return [o["text"][-2000:] for o in cell["outputs"]
            if o["mime"] == "application/vnd.jupyter.stderr" and ERROR.search(o["text"])]


def menu_and_wait(lab: Lab, top: str, item: str, timeout_s: float = 600.0) -> list[dict]:
    """Click ``top`` > ``item`` and wait for what it started to end; returns the cells.

    Two events, no fixed pause: the prompts change from what they were before the click (a cell
    queued or running, "[*]", or a count moved on), then no cell is running or queued. A pause of
    a second after the click read, under make test's load, a notebook whose "Run All" had not yet
    queued a cell: every cell "not run" (CI, 2026-12-04)."""
    before = [c["prompt"] for c in cells(lab)]
    menu(lab, top, item)
    deadline = time.monotonic() + timeout_s
    started = False
    while True:
        now = cells(lab)
        prompts = [c["prompt"] for c in now]
        running = any("*" in p for p in prompts)
        started = started or running or prompts != before
        if started and not running:
            return now
        if time.monotonic() > deadline:
            shot = screenshot(lab, "timeout")
            if not started:
                pytest.fail(f"{top} > {item} started no cell in {timeout_s:.0f} s (see {shot})")
            pytest.fail(f"cells still running after {timeout_s:.0f} s (see {shot}): "
                        f"{[c['source'][:60] for c in now if '*' in c['prompt']]}")
        time.sleep(0.25)


def run_all(lab: Lab, name: str) -> list[dict]:
    open_notebook(lab, name)
    done = menu_and_wait(lab, "Run", "Run All Cells")
    shot = screenshot(lab, name)
    failed = {c["source"][:80]: errors(c) for c in done if errors(c)}
    assert not failed, f"{name}: cells show errors (see {shot}): {failed}"
    unrun = [c["source"][:80] for c in done if not re.search(r"\[\d+\]", c["prompt"])]
    assert not unrun, f"{name}: cells not run (see {shot}): {unrun}"
    lab.remember_processes()
    return done


def cell(cells_: list[dict], contains: str) -> dict:
    return next(c for c in cells_ if contains in c["source"])


def engine_pids(c: dict) -> list[int]:
    """The pid column of the engine table a cell shows (a DataFrame rendered as HTML)."""
    assert len(c["tables"]) == 1, f"no engine table shown by {c['source']!r}: {c['outputs']}"
    return sorted(int(row["pid"]) for row in c["tables"][0])


# -- the tests ------------------------------------------------------------------------------------

def test_lab_command_puts_this_pythons_kernel_first(tmp_path):
    """What `downpour lab` runs, without a browser: the kernel spec is this Python, and a user's
    own python3 kernel (JUPYTER_PATH's later entries, ~/.local/share/jupyter) comes after it."""
    import json
    import sys

    from downpour_lib.errors import ConfigError
    from downpour_lib.notebooks import lab_command

    argv, env = lab_command(ROOT / "notebooks", ["--no-browser"], prefix=tmp_path,
                            env={"PATH": "/usr/bin", "JUPYTER_PATH": "/elsewhere"})
    spec = json.loads((tmp_path / "share/jupyter/kernels/python3/kernel.json").read_text())
    assert spec["argv"][:3] == [sys.executable, "-m", "ipykernel_launcher"]
    assert spec["env"]["PATH"] == f"{BIN}{os.pathsep}${{PATH}}" and spec["display_name"] == KERNEL
    assert env["JUPYTER_PATH"].split(os.pathsep) == [str(tmp_path / "share/jupyter"), "/elsewhere"]
    assert argv[:4] == [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={ROOT / 'notebooks'}"]
    assert "--no-browser" in argv
    with pytest.raises(ConfigError, match="directory='nope'"):
        lab_command("nope", prefix=tmp_path)


def test_00_runs_all_in_the_browser_and_shows_the_engine_table(lab):
    done = run_all(lab, "00_cluster_quickstart")
    table = lab.page.locator(f"{NOTEBOOK} .jp-OutputArea-output table.dataframe").first
    assert table.is_visible()
    rows = cell(done, "use_cluster(")["tables"][0]
    assert [list(r)[1:] for r in rows] == [["rank", "engine_id", "host", "pid"]] * 2, rows
    assert [r["rank"] for r in rows] == ["0", "1"]
    # every rank's hello: ipyparallel's streamed %px showed rank 1's alone under load (CI; see
    # test_notebooks' test_px_shows_every_engines_output_...); the page may draw it a moment late
    deadline = time.monotonic() + 15
    while True:
        hello = " ".join(o["text"] for o in cell(done, "remote.hello()")["outputs"])
        if ("hello from rank 0 of 2" in hello and "hello from rank 1 of 2" in hello) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.5)
        done = cells(lab)
    assert "hello from rank 0 of 2" in hello and "hello from rank 1 of 2" in hello, hello


def test_01_runs_all_shows_figures_and_recovers_from_an_interrupt(lab):
    done = run_all(lab, "01_train_sync_ps")
    assert "sync_ps" in " ".join(o["text"] for o in cell(done, "result = cluster.train(config)")["outputs"])
    figures = lab.page.locator(f"{NOTEBOOK} .jp-OutputArea-output img[src^='data:image/png']")
    assert figures.count() == 2  # the curves and the breakdown, drawn
    assert figures.first.evaluate("img => img.naturalWidth > 100 && img.complete")
    assert len(engine_pids(cell(done, "use_cluster("))) == 2

    # Run All ended with cluster.stop(): the start cell run again starts a new cluster; below the
    # training cell, a long training and a table of the engines are typed in, and the long one is
    # run and interrupted from the Kernel menu as it trains.
    page = lab.page
    start = page.locator(f"{NOTEBOOK} .jp-CodeCell", has_text="use_cluster(")
    ran = cell(cells(lab), "use_cluster(")["prompt"]  # "[4]:"
    start.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("Shift+Enter")  # the training cell is selected next
    page.keyboard.press("b")  # a new cell below it, selected
    page.keyboard.press("Enter")  # edit it
    page.keyboard.type("long = cluster.train(replace(config, steps=1_000_000, eval_every=0))")
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.type("cluster.table()")
    page.keyboard.press("Escape")
    page.keyboard.press("k")  # back up to the long cell
    page.keyboard.press("Shift+Enter")  # run it; the table's cell is selected next
    deadline = time.monotonic() + CELL_TIMEOUT_MS / 1000
    while (now := cell(cells(lab), "use_cluster(")["prompt"]) == ran or "*" in now:
        if time.monotonic() > deadline:
            pytest.fail(f"the cluster did not start again (see {screenshot(lab, 'start')}): {cells(lab)}")
        time.sleep(0.5)
    before = engine_pids(cell(cells(lab), "use_cluster("))
    lab.remember_processes()
    long = page.locator(f"{NOTEBOOK} .jp-CodeCell", has_text="steps=1_000_000")
    time.sleep(4.0)  # into the training on the engines
    if "*" not in long.locator(".jp-InputPrompt").inner_text():
        shot = screenshot(lab, "01_long")
        pytest.fail(f"the long run ended by itself (see {shot}): {cell(cells(lab), 'steps=1_000_000')}")
    interrupted = menu_and_wait(lab, "Kernel", "Interrupt Kernel")
    shot = screenshot(lab, "01_interrupted")
    long_cell = cell(interrupted, "steps=1_000_000")
    assert any("KeyboardInterrupt" in e for e in errors(long_cell)), f"see {shot}: {long_cell}"
    lab.remember_processes()

    # the cell below runs on restarted engines, and so do the notebook's cells after it
    after = menu_and_wait(lab, "Run", "Run Selected Cell and All Below")
    shot = screenshot(lab, "01_recovered")
    below = after[[c["source"] for c in after].index(long_cell["source"]) + 1:]
    failed = {c["source"][:80]: errors(c) for c in below if errors(c)}
    assert not failed, f"cells after the interrupt show errors (see {shot}): {failed}"
    assert all(re.search(r"\[\d+\]", c["prompt"]) for c in below), f"not all run, see {shot}"
    now = engine_pids(below[0])
    assert len(now) == 2 and not set(now) & set(before), (before, now)
    timeline = " ".join(o["text"] for o in cell(below, "from dataclasses import replace")["outputs"])
    assert "trace.json at https://ui.perfetto.dev" in timeline, timeline  # trained on them
