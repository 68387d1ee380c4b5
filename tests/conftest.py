"""Hypothesis profiles: `ci` (the default: derandomized, bounded) and `nightly` (deep).
Choose with SCHEDPROOF_PROFILE=nightly."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("nightly", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile(os.environ.get("SCHEDPROOF_PROFILE", "ci"))
