python benchmarks/frontier.py --hosts 2 --links 1gbit --interleave 50 --repeats 7 --periods 5 10 --wires bfloat16 --shadow '5%: sync.max_slowdown=0.05' '5% n10: sync.max_slowdown=0.05 sync.thread_nice=10' --aa --bracket --tag qos-5pct-bf16 --out benchmarks/results/frontier train.batch_size=1024 eval.max_batches=1
  arm none: sync.algorithm=none
  arm FR k=5 bf16: sync.algorithm=ma sync.mode=fixed_rate sync.period=5 sync.wire_dtype=bfloat16 sync.socket_ifname=veth0:sync
  arm FR k=10 bf16: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=bfloat16 sync.socket_ifname=veth0:sync
  arm S 5% bf16: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05  sync.wire_dtype=bfloat16 sync.socket_ifname=veth0:sync
  arm S 5% n10 bf16: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05 sync.thread_nice=10  sync.wire_dtype=bfloat16 sync.socket_ifname=veth0:sync
  arm none A/A: sync.algorithm=none
