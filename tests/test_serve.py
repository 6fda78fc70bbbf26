"""`alignflow serve` end to end against a Prefect server on 127.0.0.1: it stops within seconds on SIGTERM or Ctrl-C,
with its server up or gone, and a run started from the UI's form in a real browser runs with the value changed
there (minutes)."""

import os
import shutil
import signal
import subprocess
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from pydantic import BaseModel

from flows.local_server import local_prefect_server
from flows.overrides import form_model
from tasks.params.load import load_params
from tasks.pipelines import PIPELINES
from tests.conftest import ENV, lock_entries, make_project
from tests.serving import api, deployments, serving, wait_until

pytestmark = pytest.mark.slow

# What a stopping `alignflow serve` may take, Ray's shutdown included: a second or two on an idle machine, over 10 s
# when the full suite's other process keeps both cores busy.
STOP_SECONDS = 30


def _stops_in_time(serve: subprocess.Popen, signum: int, log: Path) -> None:
    """Send ``signum``: serve exits 0 within STOP_SECONDS and its Ray (processes it started) is gone."""
    started_here = psutil.Process(serve.pid).children(recursive=True)
    started = time.monotonic()
    serve.send_signal(signum)
    try:
        status = serve.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"alignflow serve still running {STOP_SECONDS} s after {signal.Signals(signum).name}:\n{log.read_text()}"
        )
    assert status == 0, log.read_text()
    _, alive = psutil.wait_procs(started_here, timeout=max(0.1, STOP_SECONDS - (time.monotonic() - started)))
    assert not alive, f"still running after serve exited: {[process.pid for process in alive]}"


def test_sigterm_stops_serve_which_pauses_its_deployments(prefect_env, tmp_path):
    project = make_project(tmp_path / "project", ("runner.schedules={sft: '0 3 * * 1'}",))
    with serving(project, prefect_env, tmp_path / "serve.log") as serve:
        # Per pipeline a deployment to run it, and one to retrain it: on its cron from params when it has one.
        crons = {d["name"]: [s["schedule"].get("cron") for s in d["schedules"]] for d in deployments(prefect_env)}
        assert crons == {
            **{name: [] for name in PIPELINES},
            **{f"retrain-{name}": ["0 3 * * 1"] if name == "sft" else [] for name in PIPELINES},
        }
        _stops_in_time(serve, signal.SIGTERM, tmp_path / "serve.log")
    # A stopped serve executes nothing: its schedules are paused rather than piling up late runs.
    paused = {d["name"]: d["paused"] for d in deployments(prefect_env)}
    assert paused == {name: name == "retrain-sft" for name in paused}, (tmp_path / "serve.log").read_text()


def test_sighup_stops_serve_as_sigterm_does(prefect_env, tmp_path):
    """A closed terminal (SIGHUP) ends serve as SIGTERM does: within seconds, status 0, nothing left running."""
    with serving(make_project(tmp_path / "project"), prefect_env, tmp_path / "serve.log") as serve:
        _stops_in_time(serve, signal.SIGHUP, tmp_path / "serve.log")


def _stop_server(env: dict[str, str]) -> None:
    port = env["PREFECT_API_URL"].split(":")[-1].split("/")[0]
    (server,) = [p for p in psutil.process_iter(["cmdline"]) if ["--port", port] == (p.info["cmdline"] or [])[-2:]]
    os.killpg(server.pid, signal.SIGKILL)  # local_prefect_server started it in a session of its own
    server.wait(timeout=30)


def test_ctrl_c_stops_serve_whose_prefect_server_is_gone(tmp_path):
    with local_prefect_server(tmp_path / "prefect-home", ENV) as env:
        project = make_project(tmp_path / "project", ("runner.schedules={sft: '0 3 * * 1'}",))  # one to pause
        with serving(project, env, tmp_path / "serve.log") as serve:
            _stop_server(env)  # Prefect's client would retry pausing the deployments for minutes
            _stops_in_time(serve, signal.SIGINT, tmp_path / "serve.log")
    assert "exiting without pausing the deployments" in (tmp_path / "serve.log").read_text()


def _field(page: Any, key: str) -> Any:
    """The form's field of the param ``key`` (its label reads ``sft.max_steps (Optional)``)."""
    # Prefect's form does not tie a label to its input (no matching id), so the field is the label's enclosing
    # p-label block (Prefect's design system's label-and-control component).
    label = page.get_by_text(f"{key} (Optional)", exact=True)
    return label.locator("xpath=ancestor::div[contains(concat(' ', @class, ' '), ' p-label ')][1]")


def _shown(page: Any, key: str) -> str:
    """The value the form shows for ``key``: an input's text, a toggle's state, or a select's chosen option."""
    field = _field(page, key)
    control = field.locator("input, textarea")
    if control.count() and control.first.get_attribute("type") == "checkbox":
        return str(control.first.is_checked())  # a toggle's input value is "on" whatever its state
    return control.input_value() if control.count() else field.locator(".p-label__body").inner_text().strip()


def _fields(model: Any, prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """(key, title, value) of every field and group of a form, groups first."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        yield f"{prefix}{name}", field.title, value
        if isinstance(value, BaseModel):
            yield from _fields(value, f"{prefix}{name}.")


def _shows(shown: str, value: Any) -> bool:
    if value is None:
        return shown == ""  # a null param is an empty field
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(shown) == value  # the form writes 1.0 as 1
    if isinstance(value, tuple | list):
        return shown == ", ".join(map(str, value))  # a list field shows its items
    return shown == str(value)


def test_a_run_from_the_ui_form_trains_with_the_value_changed_there(prefect_env, tmp_path):
    def runs_of(deployment: dict) -> list[dict]:
        return api(prefect_env, "/flow_runs/filter", {"deployments": {"id": {"any_": [deployment["id"]]}}})

    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium on PATH: `apt-get install -y chromium` (.ci/run does)")
    project = make_project(tmp_path / "project")
    before = yaml.safe_load((project / "params.yaml").read_text())
    fields = list(_fields(form_model("sft", load_params(project / "params.yaml"), project)()))
    ui = prefect_env["PREFECT_API_URL"].removesuffix("/api")
    with serving(project, prefect_env, tmp_path / "serve.log"):
        (deployment,) = [d for d in deployments(prefect_env) if d["name"] == "sft"]
        # A value outside the schema is refused when the run is created through the API: nothing runs.
        create = f"/deployments/{deployment['id']}/create_flow_run"
        with pytest.raises(urllib.error.HTTPError) as refused:
            api(prefect_env, create, {"parameters": {"params": {"sft": {"lr": -1}}}})
        assert refused.value.code in (409, 422) and not (project / "artifacts").exists()
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 6000})  # the whole form, for screenshots
                page.goto(f"{ui}/deployments/deployment/{deployment['id']}")
                page.get_by_role("button", name="Run", exact=True).click()
                page.get_by_text("Custom run", exact=True).click()
                page.get_by_text("sft — Supervised fine-tuning", exact=False).wait_for()
                page.screenshot(path=tmp_path / "run-form.png")

                # Only what sft's stages read, each section under its title, every field showing its value in
                # params.yaml: none hidden behind a toggle.
                labels = [line for line in page.inner_text("body").splitlines() if line.endswith(" (Optional)")]
                assert labels == ["params (Optional)"] + [f"{title} (Optional)" for _, title, _ in fields]
                assert "sft — Supervised fine-tuning on worked solutions (Optional)" in labels
                for key, title, value in fields:
                    assert title != key or _shows(_shown(page, key), value), (key, _shown(page, key), value)

                steps = _field(page, "sft.max_steps").locator("input")
                steps.fill("60")
                # Leave the field (its change event updates the form's state) before submitting: a click on Submit
                # right after typing can, on a busy machine, submit the value from before the edit.
                steps.press("Tab")
                sync_api.expect(steps).to_have_value("60")
                submit = page.get_by_role("button", name="Submit")
                submit.click()
                # the UI's toast when its call to create the run failed (beside it Prefect may leave an "Oops.
                # Something went wrong." toast that stays until closed)
                failed = page.get_by_text("Something went wrong trying to create a flow run")
                failures_answered = 0

                def submitted() -> bool:
                    """A run exists; under the full suite's load the UI's call to the server can fail, and the
                    form stays filled in with the toast over it: submit again, as a user would, once per toast."""
                    nonlocal failures_answered
                    if runs_of(deployment):
                        return True
                    failures = failed.count()
                    failures_answered = min(failures_answered, failures)  # toasts that went away
                    if failures > failures_answered and not runs_of(deployment):
                        failures_answered = failures
                        page.screenshot(path=tmp_path / "failed-submit.png")
                        submit.click()
                    return False

                # What the form submits is a run; the UI's redirect after it can take over 30 s on a busy machine,
                # minutes under the full suite's load (the screenshot shows where the form stood).
                try:
                    wait_until(submitted, 600, f"the form's run ({tmp_path / 'submitted.png'})")
                finally:
                    page.screenshot(path=tmp_path / "submitted.png")
            finally:
                browser.close()
        (flow_run,) = runs_of(deployment)
        flow_run_id = flow_run["id"]

        def finished() -> bool:
            return api(prefect_env, f"/flow_runs/{flow_run_id}")["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED")

        wait_until(finished, 600, "the flow run")
        assert api(prefect_env, f"/flow_runs/{flow_run_id}")["state"]["type"] == "COMPLETED"

    assert lock_entries(project)["sft"]["params"]["params.yaml"]["sft"]["max_steps"] == 60
    after = yaml.safe_load((project / "params.yaml").read_text())
    assert after["sft"].pop("max_steps") == 60 and before["sft"].pop("max_steps") == 120
    assert after == before  # the form sent every value; only the changed one was written
