"""torchrun, with exits a scheduler can read: after a preemption, a bad config, a failure.

torchrun exits 1 whenever a worker exits non-zero, so a preemption every rank handled cleanly
(each exits 143 after writing its checkpoint) reads as a failure, after a ``ChildFailedError``
traceback; and SIGTERM to torchrun itself (Slurm, Kubernetes) ends in a ``SignalException``
traceback once the workers have stopped. This runs torchrun's own ``run()`` with the same
arguments and turns exactly those two outcomes into one line and exit 143 (128 + the signal).
Any other failure ends with torchrun's summary and exit 1, without the traceback of torchrun's
own ``raise`` under it. The torchx components launch through it.

A bad configuration exits 2 after one ``error:`` line, as ``python -m
shadowsync.pipelines.train`` alone does: the training command line and its folders are checked
here before any rank starts; a check only the ranks make (data set, sharding plan) fails on
every rank with exit 2 (the line printed once per node, by local rank 0), which ends the
launch with 2 instead of torchrun's 1 and its traceback.

Like torchrun's ``main``, it leaves the outcome in ``TORCHELASTIC_ERROR_FILE`` when one is set
(torchx's ``local_cwd`` sets it and shows the file as the job's ``structured_error_msg``): the
first failed rank's error, the ``error:`` line with exit code 2, or the ``preempted:`` line
with exit code 143.

Example::

    python -m shadowsync.pipelines.launch --nproc_per_node 2 -m shadowsync.pipelines.train
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import MutableMapping

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import (
    ChildFailedError,
    ErrorHandler,
    ProcessFailure,
    record,
)
from torch.distributed.run import get_args_parser, run

from shadowsync.pipelines.config import check_folders, parse_args
from shadowsync.pipelines.console import LOG_DIR_ENV, leave_error
from shadowsync.pipelines.errors import PREEMPTED_EXIT_CODE

_RESUME = "run the same command to resume from the checkpoint"
_STOPPED_BY_TORCHRUN = {-signal.SIGTERM, -signal.SIGKILL}
_AFTER_PREEMPTION = {PREEMPTED_EXIT_CODE, *_STOPPED_BY_TORCHRUN}
_CONFIG_EXIT_CODE = 2
_TRAIN_MODULE = "shadowsync.pipelines.train"


def name_log_dir(environ: MutableMapping[str, str]) -> None:
    """Under ``local_cwd`` torchx points this process's ``TORCHELASTIC_ERROR_FILE`` into the
    folder of its stdout.log and stderr.log; torchrun gives each worker an error file of its
    own, so the folder is passed on to them here, for rank 0's summary."""
    error_file = environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file and environ.get("TORCHX_JOB_ID", "").startswith("local_cwd://"):
        environ[LOG_DIR_ENV] = os.path.dirname(os.path.abspath(error_file))


def _ends(line: str, code: int, *, printed: bool = False) -> int:
    """Prints ``line`` last (unless a rank ``printed`` it) and leaves it, with ``code``, in the
    error file (what torchx reads back)."""
    if not printed:
        print(line, file=sys.stderr, flush=True)
    leave_error(line, code)
    return code


def _config_error(args: argparse.Namespace) -> str | None:
    """The ``error:`` line of a training command line that does not make a valid config, or
    None (other modules' arguments are theirs to check)."""
    if not (args.module and args.training_script == _TRAIN_MODULE):
        return None
    logging.disable(logging.WARNING)  # the ranks warn of what a setting ignores, once each
    try:
        check_folders(parse_args(list(args.training_script_args)))
    except (ValueError, OSError) as e:
        return f"error: {e}"
    finally:
        logging.disable(logging.NOTSET)
    return None


def _failed(e: ChildFailedError) -> int:
    """torchrun's summary of a failed job, without the traceback of its own ``raise`` (the
    summary already names the ranks); the first failure's error file becomes the launcher's,
    as ``@record`` does."""
    _, first = e.get_first_failure()
    if os.path.isfile(first.error_file):
        ErrorHandler().dump_error_file(first.error_file, first.exitcode)
    else:
        leave_error(_message(first), 1)
    print(e.format_msg(), file=sys.stderr, flush=True)
    return 1


def _message(failure: ProcessFailure) -> str:
    message = failure.message
    return str(message.get("message", "")) if isinstance(message, dict) else str(message)


@record  # as torchrun's main: the first failed rank's error goes to the error file
def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if (line := _config_error(args)) is not None:
        return _ends(line, _CONFIG_EXIT_CODE)
    name_log_dir(os.environ)
    try:
        run(args)
    except ChildFailedError as e:
        codes = {f.exitcode for f in e.failures.values()}
        if _CONFIG_EXIT_CODE in codes and codes <= {_CONFIG_EXIT_CODE, *_STOPPED_BY_TORCHRUN}:
            first = min((f for f in e.failures.values() if f.exitcode == _CONFIG_EXIT_CODE),
                        key=lambda f: f.timestamp)
            return _ends(_message(first), _CONFIG_EXIT_CODE, printed=True)
        # A worker exits 143 only after the ranks agreed to stop and every rank passed the
        # checkpoint's last barrier; torchrun then stops the others with SIGTERM (SIGKILL after
        # its grace), so those deaths, beside a 143, end a completed preemption too.
        if PREEMPTED_EXIT_CODE not in codes or not codes <= _AFTER_PREEMPTION:
            return _failed(e)
        return _ends(f"preempted: every worker stopped after the same step and "
                     f"checkpointed (exit {PREEMPTED_EXIT_CODE}); {_RESUME}", PREEMPTED_EXIT_CODE)
    except SignalException as e:
        return _ends(f"preempted: the launcher got {e.sigval.name}; its workers were asked "
                     f"to stop and checkpoint within its grace (see their last lines); "
                     f"{_RESUME}", 128 + int(e.sigval))
    return 0


if __name__ == "__main__":
    sys.exit(main())
