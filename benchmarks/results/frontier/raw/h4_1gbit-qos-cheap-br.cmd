python benchmarks/frontier.py --hosts 4 --links 1gbit --interleave 100 --repeats 6 --aa --bracket --periods 10 20 --shadow '14% n19: sync.max_slowdown=0.14 sync.thread_nice=19' '10% n19: sync.max_slowdown=0.10 sync.thread_nice=19' '7% n19: sync.max_slowdown=0.07 sync.thread_nice=19' '5% n19: sync.max_slowdown=0.05 sync.thread_nice=19' --tag qos-cheap-br --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm FR k=20: sync.algorithm=ma sync.mode=fixed_rate sync.period=20 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 14% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.14 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 10% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.10 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 7% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.07 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 5% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm none A/A: sync.algorithm=none
