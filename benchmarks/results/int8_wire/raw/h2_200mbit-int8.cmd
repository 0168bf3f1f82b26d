python -m shadowsync.benchmarks.frontier --hosts 2 --links 200mbit --interleave 20 --repeats 5 --aa --bracket --periods 1 5 --wires float32 bfloat16 int8 --shadow 'b2b s1: sync.schedule.max_slowdown=null sync.schedule.max_staleness=1' 'b2b: sync.schedule.max_slowdown=null' --device-step-ms 60 --tag int8 --out benchmarks/results/int8_wire train.batch_size=32 eval.max_batches=1
  arm none: sync.strategy.name=none
  arm FR k=1: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=1 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm FR k=5: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=5 sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S b2b s1: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null sync.schedule.max_staleness=1  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm S b2b: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null  sync.transport.wire_dtype=float32 sync.transport.socket_ifname=veth0:sync
  arm FR k=1 bf16: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=1 sync.transport.wire_dtype=bfloat16 sync.transport.socket_ifname=veth0:sync
  arm FR k=5 bf16: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=5 sync.transport.wire_dtype=bfloat16 sync.transport.socket_ifname=veth0:sync
  arm S b2b s1 bf16: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null sync.schedule.max_staleness=1  sync.transport.wire_dtype=bfloat16 sync.transport.socket_ifname=veth0:sync
  arm S b2b bf16: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null  sync.transport.wire_dtype=bfloat16 sync.transport.socket_ifname=veth0:sync
  arm FR k=1 int8: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=1 sync.transport.wire_dtype=int8 sync.transport.socket_ifname=veth0:sync
  arm FR k=5 int8: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=5 sync.transport.wire_dtype=int8 sync.transport.socket_ifname=veth0:sync
  arm S b2b s1 int8: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null sync.schedule.max_staleness=1  sync.transport.wire_dtype=int8 sync.transport.socket_ifname=veth0:sync
  arm S b2b int8: sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=null  sync.transport.wire_dtype=int8 sync.transport.socket_ifname=veth0:sync
  arm none A/A: sync.strategy.name=none
