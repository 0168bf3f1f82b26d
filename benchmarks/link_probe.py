"""What the emulated cluster's links give an allreduce: :func:`probe` runs this module's
:func:`main` under ``torchrun`` on every host (:meth:`.cluster.Cluster.launch`), timed
allreduces of the given sizes, optionally beside a contending background allreduce on a group
of its own; rank 0 prints one tagged JSON line a size, which :func:`probe` reads back."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shadowsync.benchmarks.netns import SYNC_IF, ClusterError

if TYPE_CHECKING:  # the driver's side only: the worker runs on the hosts without it
    from shadowsync.benchmarks.cluster import Cluster

PROBE_TAG = "PROBE "


# -- the probe's worker (runs on every host under torchrun) -----------------------------------
def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(prog="python -m shadowsync.benchmarks.link_probe")
    parser.add_argument("--sizes", type=float, nargs="+", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--contend-mb", type=float, default=None)
    parser.add_argument("--contend-ifname", default=None)
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    background = None
    if args.contend_mb is not None:
        from shadowsync.sync.groups import new_sync_group

        background = _Contender(new_sync_group(socket_ifname=args.contend_ifname),
                                args.contend_mb)
    for size in args.sizes:
        x = torch.ones(max(1, int(size * 1e6 / 4)))
        dist.all_reduce(x)  # warm-up: connections, buffers
        times = []
        for _ in range(args.repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t0)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if dist.get_rank() == 0:
            seconds = statistics.median(slowest.tolist())
            print(PROBE_TAG + json.dumps({"size_mb": size, "seconds": seconds}), flush=True)
    if background is not None:
        background.stop()
    dist.destroy_process_group()
    return 0


class _Contender:
    """Allreduces of ``size_mb`` back to back on ``group``, on a thread, until :meth:`stop`.
    The stop request rides in the buffer (its first element), so every rank leaves after the
    same collective and none is left waiting in one."""

    def __init__(self, group: Any, size_mb: float) -> None:
        import torch

        self._group = group
        self._buf = torch.zeros(max(2, int(size_mb * 1e6 / 4)))
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import torch.distributed as dist

        while True:
            self._buf[0] = 1.0 if self._stopping.is_set() else 0.0
            dist.all_reduce(self._buf, group=self._group)
            if self._buf[0].item() > 0:
                return

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """One allreduce size on the cluster: the median over repeats of the slowest rank's time.

    ``algbw_MBps`` is payload over time (what ``size_mb`` of dense parameters cost a round);
    ``busbw_MBps`` scales it by ``2 (n - 1) / n``, the bytes a ring allreduce puts on each link,
    so it reads directly against the link rate (as in nccl-tests).
    """

    size_mb: float
    seconds: float
    hosts: int

    @property
    def algbw_MBps(self) -> float:  # noqa: N802 (the unit's spelling)
        return self.size_mb / self.seconds

    @property
    def busbw_MBps(self) -> float:  # noqa: N802
        return self.algbw_MBps * 2 * (self.hosts - 1) / self.hosts


def probe(cluster: Cluster, sizes_mb: Sequence[float] = (1, 8, 32), repeats: int = 3,
          timeout_s: float = 600, on_line: Callable[[int, str], None] | None = None,
          contend_mb: float | None = None) -> list[ProbeResult]:
    """Times a gloo allreduce of each size across all of ``cluster``'s hosts (one warm-up,
    then the median of ``repeats``): what the links give a dense synchronization round.

    With ``contend_mb``, each timed allreduce runs while a second process group (from
    :data:`SYNC_IF` under ``sync_class="low"``) sends allreduces of that size back to
    back, as a shadow synchronizer does beside training's collectives: the time then says
    what background sync traffic costs training's own on these links.

    Args:
        sizes_mb: payload sizes in MB (10**6 bytes) of float32.
        repeats: timed allreduces per size.
        contend_mb: size of the background allreduces (None: none).
        timeout_s: give up (:class:`ClusterError`) after this long.
        on_line: gets the probe processes' other output; default drops it, and a failure
            raises with its last lines.
    """
    if cluster.hosts < 2:
        raise ClusterError("probe needs at least 2 hosts")
    if repeats < 1 or not sizes_mb or min(sizes_mb) <= 0 or (contend_mb or 1) <= 0:
        raise ClusterError("probe needs repeats >= 1 and sizes (and contend_mb) > 0")
    results: list[ProbeResult] = []
    tail: list[str] = []

    def collect(host: int, line: str) -> None:
        if host == 0 and line.startswith(PROBE_TAG):
            r = json.loads(line[len(PROBE_TAG):])
            results.append(ProbeResult(r["size_mb"], r["seconds"], cluster.hosts))
        else:
            tail.append(f"[h{host}] {line}")
            del tail[:-20]
            if on_line is not None:
                on_line(host, line)

    argv = ["-m", "shadowsync.benchmarks.link_probe", "--repeats", str(repeats),
            "--sizes", *[f"{s:g}" for s in sizes_mb]]
    if contend_mb is not None:
        argv += ["--contend-mb", f"{contend_mb:g}"]
        if cluster.sync_class == "low":
            argv += ["--contend-ifname", SYNC_IF]
    rc = cluster.launch(argv, timeout_s=timeout_s, on_line=collect)
    if rc != 0 or len(results) != len(sizes_mb):
        raise ClusterError(f"probe failed (exit {rc}): " + " | ".join(tail[-5:]))
    return results


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
