python benchmarks/frontier.py --hosts 2 --links 10gbit --steps 200 --repeats 3 --periods 1 2 --shadow 'b2b s1: sync.max_slowdown=null sync.max_staleness=1' 'b2b s2: sync.max_slowdown=null sync.max_staleness=2' --tag qos-s --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm ddp: sync.algorithm=ddp
  arm FR k=1: sync.algorithm=ma sync.mode=fixed_rate sync.period=1 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm FR k=2: sync.algorithm=ma sync.mode=fixed_rate sync.period=2 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S b2b s1: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null sync.max_staleness=1  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S b2b s2: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null sync.max_staleness=2  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
