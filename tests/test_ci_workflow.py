"""The nightly workflow (.github/workflows/nightly.yml) is a valid GitHub Actions workflow that runs the deep
suite and keeps what it finds, and the test command writes JUnit XML. GitHub's own checker cannot run here, so the
file is parsed and held to the keys GitHub requires (a trigger, jobs with a runner and steps, each step one `uses`
of a pinned action or one `run`) and to what the nightly must do."""

import re
import tomllib

import pytest
import yaml

from conftest import ROOT, SHARED_DB_ARTIFACT, shared_database

WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
README = (ROOT / "README.md").read_text()
# the README's test command: the one command line that sets up and runs pytest
README_TEST_COMMAND = next(line for line in README.splitlines() if "python3 -m venv" in line and "pytest" in line)
CRON_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$")


@pytest.fixture(scope="module")
def workflow():
    return yaml.safe_load(WORKFLOW.read_text())


def steps(workflow):
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def test_the_workflow_has_the_keys_github_requires(workflow):
    # YAML 1.1 reads the bare key `on` as True; GitHub reads it as "on"
    triggers = workflow.get("on", workflow.get(True))
    assert triggers and set(triggers) <= {"schedule", "workflow_dispatch", "push", "pull_request"}
    for entry in triggers["schedule"]:
        fields = entry["cron"].split()
        assert len(fields) == 5 and all(CRON_FIELD.match(f) for f in fields), entry
    assert workflow["jobs"]
    for name, job in workflow["jobs"].items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name)
        assert job["runs-on"] and job["steps"]
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), step
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]), step["uses"]
            assert set(step) <= {"name", "uses", "run", "with", "if", "env", "id", "continue-on-error",
                                 "timeout-minutes", "working-directory", "shell"}, step


def test_the_nightly_runs_the_readme_test_command_under_the_nightly_profile(workflow):
    job_env = {k: v for job in workflow["jobs"].values() for k, v in job.get("env", {}).items()}
    assert job_env.get("SCHEDPROOF_PROFILE") == "nightly"
    runs = [step["run"] for step in steps(workflow) if "run" in step]
    assert README_TEST_COMMAND.replace("-n 2", "-n auto") in runs
    assert README_TEST_COMMAND in (ROOT / ".ci" / "run").read_text()


def test_the_nightly_keeps_its_reports_and_example_database(workflow):
    uploads = {step["with"]["name"]: step for step in steps(workflow) if step.get("uses", "").startswith("actions/upload-artifact")}
    assert uploads["nightly-reports"]["with"]["path"].rstrip("/") == "reports"
    assert uploads[SHARED_DB_ARTIFACT]["with"]["path"] == ".hypothesis/examples"
    assert all(step.get("if") == "always()" for step in uploads.values())
    downloads = [step for step in steps(workflow) if step.get("uses", "").startswith("dawidd6/action-download-artifact")]
    assert [d["with"]["name"] for d in downloads] == [SHARED_DB_ARTIFACT]
    assert downloads[0]["with"]["path"] == ".hypothesis/examples"


def test_the_test_command_writes_junit_xml_into_the_uploaded_folder():
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "--junitxml=reports/junit.xml" in addopts.split()


@pytest.mark.parametrize("spec", ["nobody", "a/b/c", "/repo", "owner/"])
def test_a_malformed_shared_database_is_a_usage_error(spec):
    with pytest.raises(pytest.UsageError, match="OWNER/REPO"):
        shared_database(spec)


@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_the_nightly_checks_conformance_in_both_loops(workflow, target):
    """`schedproof conform --target vllm|sglang` in the engine's default loop (vLLM's async scheduling, SGLang's
    event_loop_overlap) and with --sync, its drift reports under reports/."""
    runs = " && ".join(step["run"] for step in steps(workflow) if "run" in step)
    conform = [part.strip() for part in runs.split("&&") if f"schedproof conform --target {target} " in part
               and "--allow-unsupported-release" not in part]   # the newest release's: the test below
    assert len(conform) == 2 and sum("--sync" in c for c in conform) == 1, conform
    assert all("--out reports/" in c for c in conform)


@pytest.mark.parametrize("engine,target", [("transformers", "transformers"), ("vllm", "vllm"), ("sglang", "sglang")])
def test_the_nightly_checks_the_newest_release_of_each_engine_for_drift(workflow, engine, target):
    """The newest release of each engine on the package index, in an environment of its own (`schedproof env`), in
    lockstep with the model even when the target does not list it yet: its drift report under reports/."""
    [run] = [step["run"] for step in steps(workflow)
             if "run" in step and f'schedproof env "{engine}==$newest"' in step["run"]]
    assert f"pip index versions {engine} " in run
    assert (f"conform --target {target} --allow-unsupported-release" in run
            and f"--out reports/conform-{target}-newest" in run), run
    # agreement writes no report folder: the summary is kept as the release's evidence, among the night's artifacts
    assert f'--json > "reports/conform-{target}-newest-$newest.json"' in run, run
