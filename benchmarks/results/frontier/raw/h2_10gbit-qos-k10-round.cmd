python benchmarks/frontier.py --hosts 2 --links 10gbit --interleave 100 --repeats 8 --aa --bracket --trace --periods 10 --shadow '8% n19: sync.max_slowdown=0.08 sync.thread_nice=19' '6% n19: sync.max_slowdown=0.06 sync.thread_nice=19' '5% n19: sync.max_slowdown=0.05 sync.thread_nice=19' '4% n19: sync.max_slowdown=0.04 sync.thread_nice=19' --tag qos-k10-round --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 8% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.08 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 6% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.06 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 5% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 4% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.04 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm none A/A: sync.algorithm=none
