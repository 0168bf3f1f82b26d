python benchmarks/frontier.py --hosts 4 --links 1gbit --interleave 100 --repeats 6 --aa --bracket --periods 10 --shadow '12% n19: sync.max_slowdown=0.12 sync.thread_nice=19' '10% n19: sync.max_slowdown=0.10 sync.thread_nice=19' '8% n19: sync.max_slowdown=0.08 sync.thread_nice=19' --tag qos-cheap-se --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 12% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.12 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 10% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.10 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 8% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.08 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm none A/A: sync.algorithm=none
