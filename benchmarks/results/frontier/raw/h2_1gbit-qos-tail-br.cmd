python benchmarks/frontier.py --hosts 2 --links 1gbit --interleave 100 --repeats 8 --aa --bracket --periods 20 50 --shadow '6% n10: sync.max_slowdown=0.06 sync.thread_nice=10' '4% n10: sync.max_slowdown=0.04 sync.thread_nice=10' '3% n10: sync.max_slowdown=0.03 sync.thread_nice=10' '2% n10: sync.max_slowdown=0.02 sync.thread_nice=10' --tag qos-tail-br --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm FR k=20: sync.algorithm=ma sync.mode=fixed_rate sync.period=20 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm FR k=50: sync.algorithm=ma sync.mode=fixed_rate sync.period=50 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 6% n10: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.06 sync.thread_nice=10  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 4% n10: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.04 sync.thread_nice=10  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 3% n10: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.03 sync.thread_nice=10  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 2% n10: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.02 sync.thread_nice=10  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm none A/A: sync.algorithm=none
