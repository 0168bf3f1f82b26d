"""torchrun, with an exit a scheduler can read after a preemption.

torchrun exits 1 whenever a worker exits non-zero, so a preemption every rank handled cleanly
(each exits 143 after writing its checkpoint) reads as a failure, after a ``ChildFailedError``
traceback; and SIGTERM to torchrun itself (Slurm, Kubernetes) ends in a ``SignalException``
traceback once the workers have stopped. This runs torchrun's own ``run()`` with the same
arguments and turns exactly those two outcomes into one line and exit 143 (128 + the signal);
every other outcome is torchrun's, unchanged. The torchx components launch through it.

Example::

    python -m shadowsync.pipelines.launch --nproc_per_node 2 -m shadowsync.pipelines.train
"""

from __future__ import annotations

import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run

from shadowsync.pipelines.faults import PREEMPTED_EXIT_CODE

_RESUME = "run the same command to resume from the checkpoint"
_AFTER_PREEMPTION = {PREEMPTED_EXIT_CODE, -signal.SIGTERM, -signal.SIGKILL}


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    try:
        run(args)
    except ChildFailedError as e:
        codes = {f.exitcode for f in e.failures.values()}
        # A worker exits 143 only after the ranks agreed to stop and every rank passed the
        # checkpoint's last barrier; torchrun then stops the others with SIGTERM (SIGKILL after
        # its grace), so those deaths, beside a 143, end a completed preemption too.
        if PREEMPTED_EXIT_CODE not in codes or not codes <= _AFTER_PREEMPTION:
            raise
        print(f"preempted: every worker stopped after the same step and checkpointed (exit "
              f"{PREEMPTED_EXIT_CODE}); {_RESUME}", file=sys.stderr, flush=True)
        return PREEMPTED_EXIT_CODE
    except SignalException as e:
        print(f"preempted: the launcher got {e.sigval.name}; its workers were asked to stop and "
              f"checkpoint within its grace (see their last lines); {_RESUME}", file=sys.stderr,
              flush=True)
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
