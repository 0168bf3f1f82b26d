python benchmarks/frontier.py --hosts 2 --links 10gbit --interleave 100 --repeats 8 --aa --bracket --periods 5 10 --shadow '20% n19: sync.max_slowdown=0.20 sync.thread_nice=19' '15% n19: sync.max_slowdown=0.15 sync.thread_nice=19' '10% n19: sync.max_slowdown=0.10 sync.thread_nice=19' '6% n19: sync.max_slowdown=0.06 sync.thread_nice=19' --tag qos-cheap-br3 --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm FR k=5: sync.algorithm=ma sync.mode=fixed_rate sync.period=5 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 20% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.20 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 15% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.15 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 10% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.10 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 6% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.06 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm none A/A: sync.algorithm=none
