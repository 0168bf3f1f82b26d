"""The benchmark scripts, one module each, run as ``python -m shadowsync.benchmarks.<name>``
(or ``torchrun ... -m shadowsync.benchmarks.<name>``); ``docs/benchmarks.md`` lists them and
``benchmarks/results/`` holds what they measured. Importing this package imports nothing."""
