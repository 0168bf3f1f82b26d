python -m shadowsync.benchmarks.frontier --hosts 2 --ranks-per-host 2 --links 1gbit --steps 100 --repeats 3 --periods 5 --shadow 'b2b: sync.schedule.max_slowdown=null' --device-step-ms 120 --tag 1group-ddp --out benchmarks/results/replica_groups/ddp train.batch_size=32 eval.max_batches=1
  arm none: sync.strategy.name=none
  arm ddp: sync.strategy.name=ddp
  arm FR k=5: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=5 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S b2b: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
