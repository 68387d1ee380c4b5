"""The installed command read by a pipeline that stops early (`schedproof corpus scenarios | head -1`): it ends
quietly with the status of a process SIGPIPE ended (141), as the shell's own tools do, never a traceback."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXE = Path(sys.executable).with_name("schedproof")


def test_a_reader_that_goes_away_ends_the_command_quietly():
    proc = subprocess.Popen([str(EXE), "corpus", "scenarios"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    proc.stdout.close()                 # what `head -1` does after its line
    _, err = proc.communicate(timeout=300)
    assert first.strip() and proc.returncode == 141, (proc.returncode, err)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
