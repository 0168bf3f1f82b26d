"""A MODEL, not a measurement: throughput and sync gap of each arm for 1 to 1,000 trainers.

We have one machine; this is how we plan beyond it. Constants measured here by ``calibrate.py``
(one rank's step time, dense bytes, one round's local work, a loopback allreduce fit, the
measured 1- and 2-rank points) are extrapolated to N trainers on a stated network::

    python -m shadowsync.benchmarks.calibrate \\
        --out benchmarks/results/scaling_model/calibration.json
    python -m shadowsync.benchmarks.scaling_model --bandwidth-gbps 10 100 --latency-us 20

writes ``scaling.md`` (tables, and predicted vs measured at N = 1 and 2) and ``scaling.png``.
Every number for N > 2 is a prediction. Equations (seconds, bytes; beta in bytes/s)::

    allreduce, ring    A(S, N) = 2 (N-1)/N * S/beta + 2 (N-1) alpha        (0 at N = 1)
    allreduce, tree    A(S, N) = 2 S/beta + 2 ceil(log2 N) alpha  (--allreduce tree: pipelined
                                 reduce then broadcast on a binary tree)
    all-to-all         X(V, N) = 2 [(N-1)/N * V/beta + (N-1) alpha]   (pairwise exchange, twice a
                                 step: pooled embeddings forward, their gradients backward;
                                 TorchRec's pipeline overlaps the input dist; V = batch * sparse
                                 features * dim * 4; the same for every arm)
    base step          T0 = t1 + X(V, N)           t1: one rank's step alone (measured)
    none               T = T0
    ddp                T = T0 + d + A(S, N)        no overlap of the gradient allreduce with
                                                   backward (worst case); d: DDP's own cost
                                                   at N = 1 (measured)
    fixed-rate, k      T = T0 + (r + A(S, N)) / k  blocking round every k steps; gap = k
    shadow             T = T0 (1 + c)              c: the background thread's contention for
                                                   the trainer's CPU (measured at N = 1; ~0 on
                                                   GPU trainers with their own NIC: --contention)
                       R = r + A(S, N)             one round: local work r (snapshot copy,
                                                   strategy math, apply; measured) + allreduce
                       gap = max(1, ceil(R / T))   a round starts at a step boundary with its
                                                   snapshot; its delta waits for the first
                                                   boundary after it ends, where the next
                                                   snapshot is taken
    examples/s = N * batch / T

``--testbed benchmarks/results/frontier`` instead checks the model against the emulated cluster
(``cluster.py``, ``frontier.py``): constants fitted on 2 hosts, predictions for 4, written to
``testbed_fit.md``; its equations are :data:`.testbed.TESTBED_DOC`.

==================  ===================================================================
module              what
==================  ===================================================================
:mod:`.model`       the analytic model above and its constants
:mod:`.testbed`     the testbed model, its arms and measured points
:mod:`.overrides`   the overrides each arm of a testbed job ran with, in today's keys
:mod:`.fit`         fitting the testbed constants and checking them out of sample
:mod:`.report`      ``scaling.md``, ``testbed_fit.md``, their plots, the command line
==================  ===================================================================

Not modelled: stragglers, network contention between the two kinds of collectives, and
compute that changes with N (the per-rank batch is fixed).
"""

