python benchmarks/frontier.py --hosts 2 --links 10gbit --interleave 100 --repeats 8 --aa --bracket --periods 10 --shadow '8% n19 w32: sync.max_slowdown=0.08 sync.thread_nice=19 sync.slowdown_window=32' '8% n19 w128: sync.max_slowdown=0.08 sync.thread_nice=19 sync.slowdown_window=128' '5% n19 w32: sync.max_slowdown=0.05 sync.thread_nice=19 sync.slowdown_window=32' '5% n19 w128: sync.max_slowdown=0.05 sync.thread_nice=19 sync.slowdown_window=128' --tag qos-k10-win --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 8% n19 w32: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.08 sync.thread_nice=19 sync.slowdown_window=32  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 8% n19 w128: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.08 sync.thread_nice=19 sync.slowdown_window=128  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 5% n19 w32: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05 sync.thread_nice=19 sync.slowdown_window=32  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 5% n19 w128: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05 sync.thread_nice=19 sync.slowdown_window=128  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm none A/A: sync.algorithm=none
