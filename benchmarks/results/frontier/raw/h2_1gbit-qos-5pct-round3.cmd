python benchmarks/frontier.py --hosts 2 --links 1gbit --interleave 50 --repeats 7 --periods 10 --shadow '5%: sync.max_slowdown=0.05' '5% n10: sync.max_slowdown=0.05 sync.thread_nice=10' '3%: sync.max_slowdown=0.03' --aa --bracket --trace --tag qos-5pct-round3 --out benchmarks/results/frontier train.batch_size=1024 eval.max_batches=1
  arm none: sync.algorithm=none
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 5%: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 5% n10: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05 sync.thread_nice=10  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 3%: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.03  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm none A/A: sync.algorithm=none
