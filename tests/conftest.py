"""Hypothesis profiles, the suite's markers, and the example database shared with the nightly run.

Profiles: `ci` (the default: derandomized, bounded) and `nightly` (deep); choose with SCHEDPROOF_PROFILE=nightly,
which also deepens the solver searches and proofs that read it (tests/symbolic/test_check_files.py, the command
line's `--profile`). A `ci` run uses no example database (derandomized runs are their own replay); a `nightly`
run keeps its failures in `.hypothesis/examples`, which .github/workflows/nightly.yml downloads from the previous
night and uploads again. SCHEDPROOF_SHARED_DB=OWNER/REPO replays those nightly failures on a laptop: the run reads
the nightly's database artifact (Hypothesis's GitHubArtifactDatabase, read-only; GITHUB_TOKEN must be set) next
to the local one, and is not derandomized, so the database is consulted.

Markers (set here by location, so no test file has to remember them): `solver` for the symbolic checkers' tests
(tests/symbolic/: Z3 searches and proofs, most of the suite's time) and `engine` for tests that drive a real engine (transformers, vLLM's scheduler).
`pytest -m "not solver and not engine"` is the fast suite (about a minute); the README's test command runs all.
"""

import gc
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import (DirectoryBasedExampleDatabase, GitHubArtifactDatabase, MultiplexedDatabase,
                                 ReadOnlyDatabase)

from checkers.clock import fresh_context

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_DB = ROOT / ".hypothesis" / "examples"
SHARED_DB_ARTIFACT = "hypothesis-example-db"     # the artifact name the nightly workflow uploads
ENGINE_TESTS = ("test_target_transformers.py", "test_fuzz_transformers.py", "test_transformers_threaded.py", "test_target_sglang.py",
                "test_target_vllm.py", "test_scenarios_on_engines.py", "test_vllm_search_past_b7.py", "regressions")

settings.register_profile("ci", derandomize=True, max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("nightly", max_examples=5000, deadline=None, database=DirectoryBasedExampleDatabase(EXAMPLE_DB),
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)


def shared_database(spec: str):
    """The local database plus the nightly's, read-only, for SCHEDPROOF_SHARED_DB=OWNER/REPO."""
    owner, _, repo = spec.partition("/")
    if not owner or not repo or "/" in repo:
        raise pytest.UsageError(f"SCHEDPROOF_SHARED_DB: {spec!r} is not OWNER/REPO (the GitHub repository whose "
                                f"nightly workflow uploads the {SHARED_DB_ARTIFACT} artifact)")
    return MultiplexedDatabase(DirectoryBasedExampleDatabase(EXAMPLE_DB),
                               ReadOnlyDatabase(GitHubArtifactDatabase(owner, repo, artifact_name=SHARED_DB_ARTIFACT)))


def pytest_configure(config):
    profile = os.environ.get("SCHEDPROOF_PROFILE", "ci")
    if profile not in ("ci", "nightly"):
        raise pytest.UsageError(f"SCHEDPROOF_PROFILE: {profile!r} is not a profile (ci or nightly)")
    shared = os.environ.get("SCHEDPROOF_SHARED_DB")
    if shared:
        settings.register_profile(f"{profile}-shared", parent=settings.get_profile(profile), derandomize=False,
                                  database=shared_database(shared))
        profile = f"{profile}-shared"
    settings.load_profile(profile)
    config.addinivalue_line("markers", "solver: runs the symbolic checkers (Z3 searches and proofs)")
    config.addinivalue_line("markers", "engine: drives a real engine")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """What earlier tests left alive is taken out of the cyclic collector's sight before each test (gc.freeze,
    after a collection, so no cycle already garbage is kept). A worker's heap grows over hundreds of tests (Z3
    terms, caches, torch, Hypothesis' data: up to 1.25 million objects), and without this every full collection a
    test triggers walks all of it; transformers' manager calls gc.collect() as it stops. In a clean clone of
    f021f9f the real-engine ci search spent 234 of its 246 s in the collector, and took 16 s with this
    (bench/gc_time.py; docs/benchmarks.md, "The cyclic collector in the suite"). Frozen objects are still freed
    when no longer referenced; only a cycle they later form stays, which a test run can afford."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _a_fresh_solver_context():
    """Each test builds its terms in a Z3 context of its own (checkers/clock.py `fresh_context`), as it would
    in a fresh process: a worker's main context, after the terms of hundreds of tests were made and freed,
    serves new ones from scattered memory: the trim-floor search of test_core_trtllm_v1.py took 1.5 times as long
    there (docs/benchmarks.md, "A fresh Z3 context per test")."""
    with fresh_context():
        yield


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT).parts
        if parts[:2] == ("tests", "symbolic"):
            item.add_marker(pytest.mark.solver)
        if any(p in ENGINE_TESTS for p in parts):
            item.add_marker(pytest.mark.engine)
