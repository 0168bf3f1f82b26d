python -m shadowsync.benchmarks.frontier --hosts 2 --ranks-per-host 2 --links 1gbit --interleave 20 --repeats 5 --aa --bracket --periods 1 5 10 --shadow 'b2b s1: sync.schedule.max_slowdown=null sync.schedule.max_staleness=1' 'b2b: sync.schedule.max_slowdown=null' '5% n10: sync.schedule.max_slowdown=0.05 sync.transport.thread_nice=10' --device-step-ms 120 --tag 2d --out benchmarks/results/replica_groups train.batch_size=32 eval.max_batches=1 sharding.group_size=local
  arm none: sync.strategy.name=none
  arm FR k=1: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=1 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm FR k=5: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=5 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm FR k=10: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=10 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S b2b s1: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null sync.schedule.max_staleness=1  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S b2b: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S 5% n10: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=0.05 sync.transport.thread_nice=10  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm none A/A: sync.strategy.name=none
