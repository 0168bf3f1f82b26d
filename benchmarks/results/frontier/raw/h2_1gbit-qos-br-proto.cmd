python benchmarks/frontier.py --hosts 2 --links 1gbit --interleave 100 --repeats 6 --aa --bracket --tag qos-br-proto --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.strategy.name=none
  arm FR k=1: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=1 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm FR k=2: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=2 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm FR k=5: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=5 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm FR k=10: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=10 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm FR k=20: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=20 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm FR k=50: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=50 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S b2b s1: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null sync.schedule.max_staleness=1  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S b2b: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S b2b n10: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null sync.transport.thread_nice=10  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S b2b n19: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null sync.transport.thread_nice=19  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S 5% n10: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=0.05 sync.transport.thread_nice=10  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm none A/A: sync.strategy.name=none
