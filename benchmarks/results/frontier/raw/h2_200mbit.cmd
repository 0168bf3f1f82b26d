python benchmarks/frontier.py --hosts 2 --links 1gbit 200mbit --steps 120 --repeats 3 --out benchmarks/results/frontier train.batch_size=128 eval.max_batches=1
  arm none: sync.algorithm=none
  arm ddp: sync.algorithm=ddp
  arm FR k=1: sync.algorithm=ma sync.mode=fixed_rate sync.period=1 sync.wire_dtype=float32
  arm FR k=2: sync.algorithm=ma sync.mode=fixed_rate sync.period=2 sync.wire_dtype=float32
  arm FR k=5: sync.algorithm=ma sync.mode=fixed_rate sync.period=5 sync.wire_dtype=float32
  arm FR k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10 sync.wire_dtype=float32
  arm FR k=20: sync.algorithm=ma sync.mode=fixed_rate sync.period=20 sync.wire_dtype=float32
  arm FR k=50: sync.algorithm=ma sync.mode=fixed_rate sync.period=50 sync.wire_dtype=float32
  arm S back to back: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null sync.chunk_mb=0.0625 sync.wire_dtype=float32
  arm S link 50%: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=null sync.max_comm_share=0.5 sync.chunk_mb=0.0625 sync.wire_dtype=float32
  arm S 20%: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.2 sync.chunk_mb=0.0625 sync.wire_dtype=float32
  arm S 5%: sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.05 sync.chunk_mb=0.0625 sync.wire_dtype=float32
