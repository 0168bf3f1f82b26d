python benchmarks/frontier.py --hosts 4 --links 1gbit --steps 120 --repeats 2 --periods 2 5 10 20 --job-timeout-s 1800 --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm ddp: sync.algorithm=ddp
  arm FR k=2: sync.algorithm=ma sync.mode=fixed_rate sync.period=2 sync.wire_dtype=float32
  arm FR k=5: sync.algorithm=ma sync.mode=fixed_rate sync.period=5 sync.wire_dtype=float32
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=float32
  arm FR k=20: sync.algorithm=ma sync.mode=fixed_rate sync.period=20 sync.wire_dtype=float32
  arm S back to back: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null sync.chunk_mb=0.298 sync.wire_dtype=float32
  arm S link 50%: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null sync.max_comm_share=0.5 sync.chunk_mb=0.298 sync.wire_dtype=float32
  arm S 20%: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.2 sync.chunk_mb=0.298 sync.wire_dtype=float32
  arm S 5%: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05 sync.chunk_mb=0.298 sync.wire_dtype=float32
