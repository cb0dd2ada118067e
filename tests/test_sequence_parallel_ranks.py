"""Sequence-parallel scans over real ranks: the documented command (``torchrun ... -m
scanweaver_tvm.sequence_parallel.check``) run with 3 and 4 gloo ranks (2: a whole model, ``test_sequence_parallel_models.py``), one thread each, on a
prompt whose length the ranks do not divide.  Each rank runs its part through the compiled
module's ``main`` (the all-gather extern on torch.distributed); rank 0 checks every output
against the whole scan run in one process (1e-5 of its scale) and each rank's bytes against
the cost model.  A deadlock fails at the timeout instead of hanging the suite."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("form, ranks, length", [("delta", 3, 4099), ("mlstm", 4, 203)])
def test_the_documented_command_equals_one_process(form, ranks, length):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           "-m", "scanweaver_tvm.sequence_parallel.check", "--form", form, "--length", str(length)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{ranks} ranks did not finish in {err.timeout} s (a deadlock?)")
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, tail
    assert f"{form}, L = {length} over {ranks} ranks: equal to one process" in done.stdout, tail
