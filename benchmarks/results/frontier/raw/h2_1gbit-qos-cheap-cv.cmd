python benchmarks/frontier.py --hosts 2 --links 1gbit --interleave 100 --repeats 8 --aa --bracket --periods 10 20 50 --shadow '12% n10: sync.max_slowdown=0.12 sync.thread_nice=10' '9% n10: sync.max_slowdown=0.09 sync.thread_nice=10' '6% n10: sync.max_slowdown=0.06 sync.thread_nice=10' '3% n10: sync.max_slowdown=0.03 sync.thread_nice=10' --tag qos-cheap-cv --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm FR k=20: sync.algorithm=ma sync.mode=fixed_rate sync.period=20 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm FR k=50: sync.algorithm=ma sync.mode=fixed_rate sync.period=50 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 12% n10: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.12 sync.thread_nice=10  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 9% n10: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.09 sync.thread_nice=10  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 6% n10: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.06 sync.thread_nice=10  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 3% n10: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.03 sync.thread_nice=10  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm none A/A: sync.algorithm=none
