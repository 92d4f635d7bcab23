"""What the door for unmodified programs rests on, measured with CRIU alone (``benchmarks/repro/stdout_pipe.py``):
a program's stdout is a pipe whose reader stays outside the checkpoint; ``--inherit-fd`` gives the restored program
a new pipe to the same kind of reader; without it the restore reports success and the program's output is gone."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.criu
def test_a_program_s_stdout_pipe_survives_criu_with_inherit_fd_and_is_lost_without(criu):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "repro" / "stdout_pipe.py"), "--json",
                           "--criu", shlex.join(criu.command())], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    kill, leave, plain = json.loads(done.stdout)
    for c in (kill, leave, plain):
        assert c["dump_rc"] == 0 and c["restore_rc"] == 0, c
    # kill: the restored program continues from its image to the end, nothing printed twice.
    assert kill["last_restored"] == "step 40 value 1600" and kill["printed_twice"] == []
    # leave_running: it continues too, and what the original printed after the dump an outside reader sees again.
    assert leave["last_restored"] == "step 40 value 1600" and leave["printed_twice"]
    # Without --inherit-fd CRIU says the restore succeeded, and nothing more ever reaches the reader.
    assert plain["restored"] == 0
