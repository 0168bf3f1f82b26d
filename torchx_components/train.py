"""TorchX components that launch ShadowSync training (and checkpoint evaluation) under torchrun.

``torchx run`` loads this file by path (``torchx_components/train.py:train``, the default in the
repo's ``.torchxconfig``) and ``exec``\\s it into torchx's own namespace, so it uses absolute
imports only and its helpers carry a ``_shadowsync`` prefix. Signatures use ``typing.Dict``,
``List`` and ``Optional`` because torchx's component linter accepts no other spelling.
"""

import logging
import os
import sys
from typing import Dict, List, Optional

import torchx.specs as specs
from torchx.components.dist import ddp, parse_nnodes

from shadowsync.pipelines.config import DEFAULT_PRESET, check_folders, load_config

DEFAULT_IMAGE = "shadowsync:latest"
_SHADOWSYNC_CHECKS = ("all", "config", "none")


class _ShadowsyncRejected(SystemExit, ValueError):
    """A run refused before submission: ``torchx run`` exits 2 (after the one message printed),
    and a caller of the component can catch it as the ``ValueError`` it is."""


def _shadowsync_check(check: str, config: str, overrides: list[str], j: str, gpu: int) -> None:
    """Checks the run in this process before anything is submitted (every rank checks again):
    ``config`` loads and validates the config, ``all`` also checks that ``output_dir`` and
    ``checkpoint.dir`` can be written, opens its data set and plans the sharding for ``j``
    ranks on CPU or GPU, as the job will. A bad setting prints one
    ``error: ...`` line naming it and raises :class:`_ShadowsyncRejected`."""
    if check not in _SHADOWSYNC_CHECKS:
        raise ValueError(f"check={check!r}: expected one of {list(_SHADOWSYNC_CHECKS)}")
    if check == "none":
        return
    try:
        cfg = load_config(config, overrides)
        if check == "all":
            check_folders(cfg)
            # torchx shows INFO, where fbgemm logs every library it loads and TorchRec's planner
            # its search: the job's own log (rank 0) prints the plan
            logging.disable(logging.INFO)
            try:
                # torch and TorchRec load only here: `torchx run --help` and config errors stay
                # fast
                import torch

                from shadowsync.datasets import build_dataset
                from shadowsync.pipelines.build import check_sharding

                _, max_nnodes, nproc_per_node, _ = parse_nnodes(j)
                dataset = build_dataset(cfg.data.name, **cfg.data.options)
                check_sharding(cfg, dataset.spec, max_nnodes * nproc_per_node,
                               torch.device("cuda" if gpu > 0 else "cpu"), nproc_per_node)
            finally:
                logging.disable(logging.NOTSET)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise _ShadowsyncRejected(2) from e


def _shadowsync_ddp(
    module: str,
    module_args: list[str],
    *,
    j: str,
    cpu: int,
    gpu: int,
    memMB: int,
    image: str,
    name: str,
    env: dict[str, str] | None,
    max_retries: int,
    rdzv_port: int,
    mounts: list[str] | None,
) -> specs.AppDef:
    """``dist.ddp`` with ``-m module``; ddp ``shlex.quote``\\s every argument into its
    ``bash -c`` line (the shell is needed for the multi-node ``${rank0 host}`` endpoint), so
    user values arrive as the same single arguments and are never run as shell code. Its
    ``torchrun`` becomes ``python -m shadowsync.pipelines.launch`` (torchrun's own ``run()``,
    with exit 143 and one line after a clean preemption instead of 1 and a traceback)."""
    nproc_per_node = parse_nnodes(j)[2]
    if 0 < gpu < nproc_per_node:
        # every rank takes cuda:LOCAL_RANK, so a node needs a GPU per process
        raise ValueError(f"-j {j} runs {nproc_per_node} processes per node but gpu={gpu}")
    app = ddp(
        *module_args,
        m=module,
        image=image,
        name=name,
        cpu=cpu,
        gpu=gpu,
        memMB=memMB,
        j=j,
        env=dict(env or {}),  # ddp adds its own keys to the dict it is given
        max_retries=max_retries,
        rdzv_port=rdzv_port,
        mounts=mounts,
    )
    for role in app.roles:
        command = role.args[-1]
        if not command.startswith("torchrun "):
            raise RuntimeError(f"torchx's dist.ddp no longer starts with torchrun: {command!r}")
        role.args[-1] = "python -m shadowsync.pipelines.launch " + command[len("torchrun "):]
    return app


def train(
    *overrides: str,
    config: str = DEFAULT_PRESET,
    j: str = "1x2",
    cpu: int = 4,
    gpu: int = 0,
    memMB: int = 8192,
    image: str = DEFAULT_IMAGE,
    name: str = "/",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    mounts: Optional[List[str]] = None,
    m: str = "shadowsync.pipelines.train",
    check: str = "all",
) -> specs.AppDef:
    """Trains a DLRM with ``python -m shadowsync.pipelines.train`` on every rank, via torchrun.

    For instance ``torchx run -s local_cwd --config synthetic -j 1x2 train.steps=40
    output_dir=/tmp/run``. Macros such as ``${app_id}`` in overrides are expanded by torchx
    (e.g. ``output_dir=/shared/runs/${app_id}``); write ``$$`` for a literal ``$``. The run is
    checked before it is submitted: a bad setting ends ``torchx run`` with one ``error:`` line
    and exit code 2, and nothing starts.

    Args:
        overrides: dotted config overrides (``key.sub=value``, values parsed as YAML), each one
            argument; ``output_dir=DIR`` (on shared storage for multi-node runs) receives
            config.yaml and metrics.jsonl
        config: a preset name in pipelines/configs (``movielens_1m``, ``synthetic``) or a
            YAML path in the image
        j: {nnodes}x{nproc_per_node}; on GPU hosts nproc_per_node must not exceed gpu
        cpu: cpus per node (replica)
        gpu: gpus per node (replica); 0 runs gloo on CPU, otherwise NCCL with one GPU per rank
        memMB: memory per node (replica) in MB
        image: container image with shadowsync installed (Kubernetes, Docker); the working
            directory for local_cwd and Slurm
        name: job name, ``{experiment}/{run}`` as in dist.ddp
        env: extra environment variables for every rank (e.g. NCCL_DEBUG=INFO)
        max_retries: how many times the scheduler may restart the whole job
        rdzv_port: port of the c10d rendezvous store on the first node (multi-node runs only)
        mounts: scheduler mounts, e.g. type=volume,src=PVC,dst=/mnt/shared for Kubernetes
        m: the entry module (another ShadowSync entry point taking the same arguments)
        check: what to check here before submitting: ``all`` (the config, that its
            folders can be written, its data set and the sharding plan for ``j`` and ``gpu``;
            for folders and data this machine reads, as with local_cwd), ``config``
            (folders and data only the cluster reads) or ``none`` (a config file only the
            image holds)
    """
    _shadowsync_check(check, config, list(overrides), j, gpu)
    return _shadowsync_ddp(
        m,
        ["--config", config, *overrides],
        j=j,
        cpu=cpu,
        gpu=gpu,
        memMB=memMB,
        image=image,
        name=name,
        env=env,
        max_retries=max_retries,
        rdzv_port=rdzv_port,
        mounts=mounts,
    )


def evaluate(
    *overrides: str,
    checkpoint: str,
    config: Optional[str] = None,
    j: str = "1x2",
    cpu: int = 4,
    gpu: int = 0,
    memMB: int = 8192,
    image: str = DEFAULT_IMAGE,
    name: str = "/",
    env: Optional[Dict[str, str]] = None,
    rdzv_port: int = 29500,
    mounts: Optional[List[str]] = None,
    check: str = "all",
) -> specs.AppDef:
    """Evaluates a checkpoint with ``python -m shadowsync.pipelines.evaluate`` under torchrun.

    For instance ``torchx run torchx_components/train.py:evaluate --checkpoint runs/ckpt``:
    every rank restores its shard of the checkpoint (the newest complete one under a root) and
    rank 0 prints exact AUC, NE and calibration over the eval split. The model and data come
    from the run's config stored in the checkpoint; run it with the world size (``-j``) of the
    run that wrote it. The config is checked before submitting, as for ``train``, when the
    checkpoint (or ``config``) is readable here.

    Args:
        overrides: dotted config overrides (``key.sub=value``), each one argument
        checkpoint: a checkpoint directory, or a root holding several, visible to every node
        config: a preset name or YAML path in the image replacing the checkpoint's own config
        j: {nnodes}x{nproc_per_node}; on GPU hosts nproc_per_node must not exceed gpu
        cpu: cpus per node (replica)
        gpu: gpus per node (replica)
        memMB: memory per node (replica) in MB
        image: container image with shadowsync installed
        name: job name, ``{experiment}/{run}`` as in dist.ddp
        env: extra environment variables for every rank
        rdzv_port: port of the c10d rendezvous store on the first node (multi-node runs only)
        mounts: scheduler mounts, e.g. type=volume,src=PVC,dst=/mnt/shared for Kubernetes
        check: ``all``, ``config`` or ``none``, as for ``train``
    """
    stored = f"{checkpoint.rstrip('/')}/config.yaml"  # a step folder's, if it is one
    if config is not None or os.path.isfile(stored):
        _shadowsync_check(check, config or stored, list(overrides), j, gpu)
    return _shadowsync_ddp(
        "shadowsync.pipelines.evaluate",
        ["--checkpoint", checkpoint, *(["--config", config] if config else []), *overrides],
        j=j,
        cpu=cpu,
        gpu=gpu,
        memMB=memMB,
        image=image,
        name=name,
        env=env,
        max_retries=0,
        rdzv_port=rdzv_port,
        mounts=mounts,
    )
