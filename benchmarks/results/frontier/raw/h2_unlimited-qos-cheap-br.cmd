python benchmarks/frontier.py --hosts 2 --links unlimited --interleave 100 --repeats 8 --aa --bracket --periods 5 10 --shadow '12% n19: sync.max_slowdown=0.12 sync.thread_nice=19' '9% n19: sync.max_slowdown=0.09 sync.thread_nice=19' '6% n19: sync.max_slowdown=0.06 sync.thread_nice=19' --tag qos-cheap-br --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm FR k=5: sync.algorithm=ma sync.mode=fixed_rate sync.period=5 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 12% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.12 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 9% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.09 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 6% n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.06 sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm none A/A: sync.algorithm=none
