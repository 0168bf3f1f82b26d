"""torchrun, with an exit a scheduler can read after a preemption.

torchrun exits 1 whenever a worker exits non-zero, so a preemption every rank handled cleanly
(each exits 143 after writing its checkpoint) reads as a failure, after a ``ChildFailedError``
traceback; and SIGTERM to torchrun itself (Slurm, Kubernetes) ends in a ``SignalException``
traceback once the workers have stopped. This runs torchrun's own ``run()`` with the same
arguments and turns exactly those two outcomes into one line and exit 143 (128 + the signal);
every other outcome is torchrun's, unchanged. The torchx components launch through it.

Like torchrun's ``main``, it leaves the outcome in ``TORCHELASTIC_ERROR_FILE`` when one is set
(torchx's ``local_cwd`` sets it and shows the file as the job's ``structured_error_msg``): the
first failed rank's error, or the ``preempted:`` line with exit code 143.

Example::

    python -m shadowsync.pipelines.launch --nproc_per_node 2 -m shadowsync.pipelines.train
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import MutableMapping

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.run import get_args_parser, run

from shadowsync.pipelines.console import LOG_DIR_ENV
from shadowsync.pipelines.faults import PREEMPTED_EXIT_CODE

_RESUME = "run the same command to resume from the checkpoint"
_AFTER_PREEMPTION = {PREEMPTED_EXIT_CODE, -signal.SIGTERM, -signal.SIGKILL}


def name_log_dir(environ: MutableMapping[str, str]) -> None:
    """Under ``local_cwd`` torchx points this process's ``TORCHELASTIC_ERROR_FILE`` into the
    folder of its stdout.log and stderr.log; torchrun gives each worker an error file of its
    own, so the folder is passed on to them here, for rank 0's summary."""
    error_file = environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file and environ.get("TORCHX_JOB_ID", "").startswith("local_cwd://"):
        environ[LOG_DIR_ENV] = os.path.dirname(os.path.abspath(error_file))


def _preempted(line: str, code: int) -> int:
    """Prints ``line`` last and leaves it, with ``code``, in the error file in torchelastic's
    shape (what torchx reads back)."""
    print(line, file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        reply = {"message": line, "errorCode": code,
                 "extraInfo": {"timestamp": str(int(time.time()))}}
        with open(error_file, "w") as f:
            json.dump({"message": reply}, f)
    return code


@record  # as torchrun's main: the first failed rank's error goes to the error file
def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    name_log_dir(os.environ)
    try:
        run(args)
    except ChildFailedError as e:
        codes = {f.exitcode for f in e.failures.values()}
        # A worker exits 143 only after the ranks agreed to stop and every rank passed the
        # checkpoint's last barrier; torchrun then stops the others with SIGTERM (SIGKILL after
        # its grace), so those deaths, beside a 143, end a completed preemption too.
        if PREEMPTED_EXIT_CODE not in codes or not codes <= _AFTER_PREEMPTION:
            raise
        return _preempted(f"preempted: every worker stopped after the same step and "
                          f"checkpointed (exit {PREEMPTED_EXIT_CODE}); {_RESUME}",
                          PREEMPTED_EXIT_CODE)
    except SignalException as e:
        return _preempted(f"preempted: the launcher got {e.sigval.name}; its workers were asked "
                          f"to stop and checkpoint within its grace (see their last lines); "
                          f"{_RESUME}", 128 + int(e.sigval))
    return 0


if __name__ == "__main__":
    sys.exit(main())
