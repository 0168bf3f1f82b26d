"""TorchX component for the Criteo TSV -> ``.npy`` conversion (one process, no torchrun).

Loaded by path and ``exec``\\d by ``torchx run`` like ``train.py``: absolute imports only, and
``typing.Dict``/``List``/``Optional`` as torchx's component linter requires.
"""

from typing import Dict, List, Optional

import torchx.specs as specs


def preprocess(
    *inputs: str,
    out: str,
    num_embeddings: str = "100000",
    on_bad_row: str = "raise",
    cpu: int = 2,
    memMB: int = 8192,
    image: str = "shadowsync:latest",
    env: Optional[Dict[str, str]] = None,
    mounts: Optional[List[str]] = None,
) -> specs.AppDef:
    """Converts Criteo TSV files to TorchRec's per-day ``.npy`` layout with
    ``python -m shadowsync.datasets.criteo_preprocess``, in bounded memory.

    A plain Role rather than ``utils.python``, which takes no env or mounts (the output has to
    land on shared storage for the training job to read it).

    Args:
        inputs: Criteo TSV files (day_N, train.txt, .gz) as seen by the job
        out: output directory (on shared storage for a cluster run)
        num_embeddings: table size for all 26 features, or 26 comma-separated sizes
        on_bad_row: raise or skip a malformed row
        cpu: cpus for the process
        memMB: memory for the process in MB
        image: container image with shadowsync installed; the working directory for local_cwd
        env: extra environment variables
        mounts: scheduler mounts, e.g. type=volume,src=PVC,dst=/mnt/shared for Kubernetes
    """
    if not inputs:
        raise ValueError("preprocess needs at least one input file")
    return specs.AppDef(
        name="criteo_preprocess",
        roles=[
            specs.Role(
                name="criteo_preprocess",
                image=image,
                entrypoint="python",
                args=[
                    "-m", "shadowsync.datasets.criteo_preprocess",
                    "--out", out,
                    "--num-embeddings", num_embeddings,
                    "--on-bad-row", on_bad_row,
                    "--",  # inputs are file names even if one starts with "-"
                    *inputs,
                ],
                env=dict(env or {}),
                resource=specs.resource(cpu=cpu, gpu=0, memMB=memMB),
                mounts=specs.parse_mounts(mounts) if mounts else [],
            )
        ],
    )
