python benchmarks/frontier.py --hosts 2 --links 200mbit --steps 200 --repeats 3 --periods 5 --shadow 'b2b s4: sync.max_slowdown=null sync.max_staleness=4' 'b2b n10 s4: sync.max_slowdown=null sync.thread_nice=10 sync.max_staleness=4' --tag qos-s4 --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm ddp: sync.algorithm=ddp
  arm FR k=5: sync.algorithm=ma sync.mode=fixed_rate sync.period=5 sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S b2b s4: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null sync.max_staleness=4  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
  arm S b2b n10 s4: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null sync.thread_nice=10 sync.max_staleness=4  sync.wire_dtype=float32 sync.socket_ifname=veth0:sync
