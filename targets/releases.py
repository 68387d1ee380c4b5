"""Which engine releases a target drives, and `--allow-unsupported-release`.

A target drives the releases it has evidence for (`SUPPORTED` in targets/transformers_cb.py and targets/vllm_v1.py;
SGLang: the release its policy mirrors) and refuses any other in one line (exit 4). With
`--allow-unsupported-release` (`conform`, `fuzz`, `python -m targets.lockstep`) it drives the installed release
anyway, in lockstep against the model of the nearest modelled release at or below it (model/releases.py
`nearest`), and says so once on stderr: every difference the new release makes to scheduling is then a
MODEL-CONFORMANCE divergence, shrunk and reported like any finding, and an API the adapter uses that moved is still
an adapter mismatch (exit 5). The flag travels as an environment variable, which a campaign's spawned workers
inherit and `fuzz --ray` puts in its tasks' runtime environment (schedproof/campaign.py).
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from .protocol import TargetUnavailable

ALLOW_ENV = "SCHEDPROOF_ALLOW_UNSUPPORTED_RELEASE"
_said: set[tuple[str, str]] = set()


def allow_unsupported(on: bool = True) -> None:
    """What `--allow-unsupported-release` does: this process and the ones it starts drive any installed release."""
    if on:
        os.environ[ALLOW_ENV] = "1"


def allowed() -> bool:
    return os.environ.get(ALLOW_ENV) == "1"


def gate(engine: str, version: str, refusal: Optional[str], modelled: str) -> None:
    """Refuse `engine` `version` with `refusal` (TargetUnavailable, exit 4) unless it is None or unsupported
    releases are allowed; allowed, say once per process which model it is held to."""
    if refusal is None:
        return
    if not allowed():
        raise TargetUnavailable(f"{refusal} (or drive it anyway against the model of {modelled}: "
                                f"--allow-unsupported-release)")
    if (engine, version) not in _said:
        _said.add((engine, version))
        print(f"schedproof: {engine} {version} is not a supported release: driven in lockstep against the model of "
              f"{engine} {modelled} (--allow-unsupported-release); every difference is reported as a divergence",
              file=sys.stderr, flush=True)
