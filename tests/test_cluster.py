"""The emulated multi-host cluster (``benchmarks/cluster.py``): links hold their rate, the real
training CLI runs across hosts, and no exit path leaves a namespace behind.

Needs root and network namespaces; elsewhere every test that builds a cluster is skipped with
the reason (``pytest -rs`` shows it). Clusters are named after this process, so a run never
touches anyone else's (``ip netns list`` may show other clusters; only ours are asserted on).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shadowsync.benchmarks import cluster as cl
from shadowsync.benchmarks import link_probe, netns
from tests._dist import SMALL

REPO = Path(__file__).resolve().parents[1]

NAME = f"ci{os.getpid()}"
# The training CLI at test size, 10 steps.
TRAIN = ["-m", "shadowsync.pipelines.train", *SMALL, "train.steps=10"]
# Host 1 fails at once; host 0 would sleep for a minute (as a rank waiting on a dead peer would).
FAIL_ON_H1 = ["--no-python", "sh", "-c",
              'if [ "$GROUP_RANK" = 1 ]; then echo failing; exit 3; fi; echo waiting; sleep 60']


@pytest.fixture
def root_ns() -> None:
    """Skips, saying why, where clusters cannot be built (not root, no ip/tc, no netns)."""
    reason = netns.unavailable_reason()
    if reason is not None:
        pytest.skip(f"emulated cluster unavailable: {reason}")


def _ours(name: str = NAME) -> list[str]:
    return sorted(ns for ns in netns.list_namespaces() if ns.startswith(f"{netns.PREFIX}-{name}"))


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "shadowsync.benchmarks.cluster", *args]


# -- no root needed ---------------------------------------------------------------------------
def test_rates_and_sizes_parse_like_tc() -> None:
    assert netns.parse_rate("200mbit") == 200_000_000
    assert netns.parse_rate("1gbit") == 10**9
    assert netns.parse_rate("125mbps") == 10**9  # tc: bps is bytes per second
    assert netns.parse_rate("1.5Gbit") == 1_500_000_000
    assert netns.parse_rate("unlimited") is None and netns.parse_rate(None) is None
    for bad in ("200", "fast", "1gbit; rm -rf /", "10bit"):
        with pytest.raises(netns.ClusterError):
            netns.parse_rate(bad)
    assert netns.parse_size("256kb") == 256 * 1024 and netns.parse_size("65536") == 65536
    with pytest.raises(netns.ClusterError):
        netns.parse_size("lots")
    assert netns.default_burst(10**9) == 250_000  # 2 ms at 1 Gbit/s
    assert netns.default_burst(10**6) == 32 * 1024


def test_bad_settings_fail_before_touching_the_system() -> None:
    with pytest.raises(netns.ClusterError, match="hosts"):
        cl.Cluster(hosts=0)
    with pytest.raises(netns.ClusterError, match="name"):
        cl.Cluster(name="../etc")
    with pytest.raises(netns.ClusterError, match="rate"):
        cl.Cluster(rate="1 gigabit")
    c = cl.Cluster(hosts=3, name="x", links=cl.Links(
        up_rate="1gbit", down_rate="200mbit", shared_rate="2gbit"))
    assert c.describe() == "cluster 'x': 3 hosts, links up 1gbit / down 200mbit, shared 2gbit"
    argv = c.torchrun_argv(2, 29500, ["-m", "mod", "a=b c"])
    assert argv[:4] == ["ip", "netns", "exec", "ssc-x-h2"]
    assert Path(argv[4]) == Path(sys.executable).parent / "torchrun"
    assert argv[5:] == ["--nnodes=3", "--nproc_per_node=1", "--node_rank=2",
                        "--master_addr=198.18.0.1", "--master_port=29500", "-m", "mod", "a=b c"]
    with pytest.raises(netns.ClusterError, match="sync_class"):
        cl.Cluster(links=cl.Links(sync_class="high"))
    low = cl.Cluster(hosts=2, rate="1gbit", name="y", links=cl.Links(sync_class="low"))
    assert low.describe() == "cluster 'y': 2 hosts, links 1gbit, sync traffic in a low class"
    assert low.sync_address(1) == "198.18.1.2" and low.address(1) == "198.18.0.2"


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the message a non-root user gets")
def test_not_root_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cl.main(["up", "--name", NAME]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "root" in err, err


# -- root and namespaces ----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(30)
def test_up_replaces_and_down_removes_only_its_own(root_ns: None) -> None:
    other = f"{NAME}-b"  # a name that starts with ours: must not be matched
    try:
        cl.Cluster(hosts=3, rate="1gbit", name=NAME).up()
        cl.Cluster(hosts=1, name=other).up()
        c = cl.Cluster(hosts=2, rate="100mbit", name=NAME,
                       links=cl.Links(shared_rate="300mbit")).up()
        assert netns.cluster_namespaces(NAME) == [f"ssc-{NAME}-h0", f"ssc-{NAME}-h1",
                                                f"ssc-{NAME}-sw"]
        assert netns.list_clusters()[NAME] == 2 and netns.list_clusters()[other] == 1
        up = subprocess.run(["tc", "-n", c.host_ns(1), "qdisc", "show", "dev", netns.HOST_IF],
                            capture_output=True, text=True, check=True).stdout
        assert "tbf" in up and "100Mbit" in up, up
        sw = subprocess.run(["tc", "-n", c.switch_ns, "qdisc", "show"],
                            capture_output=True, text=True, check=True).stdout
        assert "dev ifb0 root" in sw and "300Mbit" in sw and sw.count("ingress") == 2, sw
        lo = subprocess.run(["ip", "-n", c.host_ns(0), "-br", "link", "show", "lo"],
                            capture_output=True, text=True, check=True).stdout
        assert "UP" in lo, lo
        # No route out: only the cluster's own /24.
        routes = subprocess.run(["ip", "-n", c.host_ns(0), "route"],
                                capture_output=True, text=True, check=True).stdout
        assert routes.split()[0] == "198.18.0.0/24" and "default" not in routes, routes
        c.down()
        assert _ours() == [f"ssc-{other}-h0", f"ssc-{other}-sw"]
    finally:
        netns.down(NAME)
        netns.down(other)
    assert _ours() == []
    assert not (netns.ETC_NETNS / f"ssc-{NAME}-h0").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_limited_link_and_training_across_hosts(root_ns: None) -> None:
    lines: list[tuple[int, str]] = []
    # A shadow job sends its rounds from the sync address: they cross the link in the low class
    # while its all-to-alls use the default one.
    shadow = [*TRAIN, "sync.strategy.name=ma", "sync.schedule.mode=shadow",
              f"sync.transport.socket_ifname={netns.SYNC_IF}"]
    with cl.Cluster(hosts=2, rate="200mbit", name=NAME, links=cl.Links(sync_class="low")) as c:
        # 8 MB at 200 Mbit/s (25 MB/s) is 0.32 s on the wire; unlimited it is ~10 ms.
        (r,) = link_probe.probe(c, [8], repeats=1)
        assert r.seconds >= 0.25, r
        assert r.algbw_MBps < 26, r
        sent_before, _ = c.traffic(1)
        classes_before = _class_bytes(c)
        rc = c.launch(shadow, on_line=lambda h, line: lines.append((h, line)), timeout_s=90)
        sent, received = c.traffic(1)
        classes = _class_bytes(c)
    log = "\n".join(f"[h{h}] {line}" for h, line in lines)
    assert rc == 0, log[-4000:]
    assert any(h == 0 and "world 2 on cpu (gloo)" in line for h, line in lines), log[-4000:]
    host0 = "\n".join(line for h, line in lines if h == 0)  # rank 0's summary table, once
    assert len(re.findall(r"(^|:)metric +value$", host0, re.M)) == 1, log[-4000:]
    assert re.search(r"(^|:)step +10$", host0, re.M), log[-4000:]
    assert re.search(r"(^|:)eval_examples +[1-9][\d,]*$", host0, re.M), log[-4000:]
    # Host 1 ran too: its all-to-alls and dense syncs went over its emulated link. (Its rank
    # prints nothing now that third-party warnings are quiet; test_sigterm_tears_down checks
    # that a host's output comes back.)
    assert sent - sent_before > 100_000 and received > 100_000, (sent, received)
    for leaf in ("1:10", "1:20"):
        assert classes[leaf] - classes_before[leaf] > 50_000, (classes_before, classes)
    assert _ours() == []


def _class_bytes(c: cl.Cluster) -> dict[str, int]:
    """Bytes host 1 sent in each htb class of its link."""
    stats = subprocess.run(["tc", "-n", c.host_ns(1), "-s", "class", "show", "dev", netns.HOST_IF],
                           capture_output=True, text=True, check=True).stdout
    return {m[0]: int(m[1]) for m in re.findall(r"class htb (1:\d+) .*\n\s*Sent (\d+) bytes",
                                                 stats)}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_low_sync_class_keeps_training_traffic_ahead_of_sync_rounds(root_ns: None) -> None:
    # 1 MB alone takes 40 ms at 200 Mbit/s (25 MB/s). Beside back-to-back 8 MB rounds of a
    # second group, one FIFO per link queues it behind them; with the sync rounds in the low
    # class it goes first, in about its time alone.
    times = {}
    for sync_class in ("same", "low"):
        with cl.Cluster(hosts=2, rate="200mbit", name=NAME,
                        links=cl.Links(sync_class=sync_class)) as c:
            (r,) = link_probe.probe(c, [1], repeats=3, contend_mb=8)
            times[sync_class] = r.seconds
    assert times["low"] < 0.08, times
    assert times["same"] > 1.5 * times["low"], times
    assert _ours() == []


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_pinned_hosts_run_on_cpus_of_their_own(root_ns: None) -> None:
    lines: list[tuple[int, str]] = []
    show = ["--no-python", sys.executable, "-c",
            "import os, threading; t = threading.Thread(target=lambda: print("
            "'cpus', sorted(os.sched_getaffinity(0)))); t.start(); t.join()"]
    with cl.Cluster(hosts=3, name=NAME) as c:
        assert c.launch(show, on_line=lambda h, line: lines.append((h, line)),
                        timeout_s=40, pin_cpus=True) == 0
        assert c.launch(show, on_line=lambda h, line: lines.append((h + 3, line)),
                        timeout_s=40) == 0
    seen = {h: line for h, line in lines if line.startswith("cpus")}
    cpus = sorted(os.sched_getaffinity(0))
    # pinned: a worker's threads too, round robin when hosts outnumber CPUs; unpinned: all
    assert seen == {**{h: f"cpus {[cpus[h % len(cpus)]]}" for h in range(3)},
                    **{h: f"cpus {cpus}" for h in range(3, 6)}}, lines
    assert _ours() == []


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_failing_host_stops_the_others_and_removes_the_cluster(root_ns: None) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(_cli("run", "--name", NAME, "--hosts", "2", "--", *FAIL_ON_H1),
                          capture_output=True, text=True, timeout=50, cwd=REPO)
    wall = time.monotonic() - t0
    assert proc.returncode not in (0, 2), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[h1] failing" in proc.stdout and "[h0] waiting" in proc.stdout
    assert "h1 exit" in proc.stderr, proc.stderr[-2000:]
    assert wall < 30, wall  # not host 0's 60 s sleep
    assert _ours() == []


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_sigterm_tears_down(root_ns: None) -> None:
    proc = subprocess.Popen(
        _cli("run", "--name", NAME, "--hosts", "2", "--", "--no-python", "sh", "-c",
             "echo ready; sleep 60"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    assert proc.stdout is not None
    seen: set[str] = set()
    for line in proc.stdout:
        if line.strip().endswith("ready"):
            seen.add(line[:4])
        if len(seen) == 2:
            break
    assert seen == {"[h0]", "[h1]"}
    proc.send_signal(signal.SIGTERM)
    proc.stdout.read()
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert _ours() == []
