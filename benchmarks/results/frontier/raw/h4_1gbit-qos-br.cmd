python benchmarks/frontier.py --hosts 4 --links 1gbit --interleave 100 --repeats 6 --aa --bracket --periods 1 2 5 10 20 --shadow 'b2b s1: sync.max_slowdown=null sync.max_staleness=1' 'b2b: sync.max_slowdown=null' 'b2b n19: sync.max_slowdown=null sync.thread_nice=19' '5% n10: sync.max_slowdown=0.05 sync.thread_nice=10' --tag qos-br --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm FR k=1: sync.algorithm=ma sync.mode=fixed_rate sync.period=1 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm FR k=2: sync.algorithm=ma sync.mode=fixed_rate sync.period=2 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm FR k=5: sync.algorithm=ma sync.mode=fixed_rate sync.period=5 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm FR k=20: sync.algorithm=ma sync.mode=fixed_rate sync.period=20 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S b2b s1: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null sync.max_staleness=1  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S b2b: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S b2b n19: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null sync.thread_nice=19  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S 5% n10: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05 sync.thread_nice=10  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm none A/A: sync.algorithm=none
