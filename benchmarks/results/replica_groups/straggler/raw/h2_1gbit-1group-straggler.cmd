python -m shadowsync.benchmarks.frontier --hosts 2 --ranks-per-host 2 --links 1gbit --aa --bracket --periods 1 5 --shadow 'b2b: sync.schedule.max_slowdown=null' --interleave 20 --repeats 5 --device-step-ms 120 180 --tag 1group-straggler --out benchmarks/results/replica_groups/straggler train.batch_size=32 eval.max_batches=1
  arm none: sync.strategy.name=none
  arm FR k=1: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=1 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm FR k=5: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=5 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S b2b: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm none A/A: sync.strategy.name=none
