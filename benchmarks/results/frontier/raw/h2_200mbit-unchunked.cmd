python benchmarks/frontier.py --hosts 2 --links 1gbit 200mbit 10gbit unlimited --steps 120 --repeats 3 --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm ddp: sync.algorithm=ddp
  arm FR k=1: sync.algorithm=ma sync.mode=fixed_rate sync.period=1
  arm FR k=2: sync.algorithm=ma sync.mode=fixed_rate sync.period=2
  arm FR k=5: sync.algorithm=ma sync.mode=fixed_rate sync.period=5
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10
  arm FR k=20: sync.algorithm=ma sync.mode=fixed_rate sync.period=20
  arm FR k=50: sync.algorithm=ma sync.mode=fixed_rate sync.period=50
  arm S back to back: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null
  arm S 20%: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.2
  arm S 5%: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05
  arm S 2%: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.02
