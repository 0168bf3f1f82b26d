"""TorchX components: valid AppDefs, rendered for local_cwd, Slurm and Kubernetes with every
override reaching torchrun as one untouched argument, and real local_cwd runs (2-rank training to
SUCCEEDED with its metrics, two nodes meeting through c10d rendezvous, a failing rank to FAILED
with its error in the logs).

Rendered commands are executed by a real bash with fake ``torchrun``/``srun`` executables that
record their argv, so quoting is checked by the shell that will run it, not by string matching.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.elastic.utils.distributed import get_free_port
from torchx.components.component_test_base import ComponentTestCase
from torchx.runner import Runner, get_runner
from torchx.specs import AppState, AppStatus
from torchx.specs.builders import materialize_appdef
from torchx.specs.finder import get_component

from shadowsync.pipelines import launch
from shadowsync.pipelines.console import logs
from shadowsync.testing import wait_for_app
from shadowsync.torchx_components import preprocess as preprocess_components
from shadowsync.torchx_components import train as train_components
from shadowsync.torchx_components.preprocess import preprocess
from shadowsync.torchx_components.train import evaluate, train

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = "shadowsync.pipelines.launch"  # torchrun with the preemption exit
VENV_BIN = Path(sys.executable).parent  # torchx runs `torchrun` from PATH
MODULE = "shadowsync.pipelines.train"
SHORT = [
    "train.steps=40",
    "eval.max_batches=2",
    "eval.every_steps=null",
    "data.options.num_embeddings=1000",
]
# One argument each, whatever a shell would make of them.
TRICKY = [
    "output_dir=/shared/a b; touch pwned 'q' \"$(id)\" `id` $HOME > x",
    "model.dense_arch_layer_sizes=[32, 16]",
]
RUN_TIMEOUT_S = 150


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """``python`` (the components' launcher runs as ``python -m shadowsync.pipelines.launch``)
    and ``srun`` stand-ins that save their argv (NUL-separated) and exit 0."""
    bin_dir = tmp_path / "fake_bin"
    bin_dir.mkdir()
    for tool in ("python", "srun"):
        exe = bin_dir / tool
        exe.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > \"{bin_dir}/{tool}.argv\"\n")
        exe.chmod(0o755)
    return bin_dir


def _run_shell(argv: list[str], fake_bin: Path, env: dict[str, str], cwd: Path) -> None:
    full_env = {**os.environ, **env, "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(argv, env=full_env, cwd=cwd, check=True, timeout=30, capture_output=True)


def _argv(fake_bin: Path, tool: str) -> list[str]:
    return (fake_bin / f"{tool}.argv").read_text().split("\0")[:-1]


def _torchrun_argv(bash_c: list[str], fake_bin: Path, env: dict[str, str]) -> list[str]:
    """What torchrun (run by the launcher) receives when ``bash -c CMD`` (the role's command)
    runs with ``env``."""
    assert bash_c[:2] == ["bash", "-c"] and len(bash_c) == 3, bash_c
    _run_shell(bash_c, fake_bin, env, fake_bin)
    argv = _argv(fake_bin, "python")
    assert argv[:2] == ["-m", LAUNCHER], argv
    return argv[2:]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _program(argv: list[str]) -> list[str]:
    """torchrun's ``-m MODULE ARGS...``: everything the training module is started with (after
    the launcher's own ``-m``, when ``argv`` has it)."""
    start = argv.index(LAUNCHER) + 1 if LAUNCHER in argv else 0
    return argv[argv.index("-m", start):]


class TestComponentsParse(ComponentTestCase):
    """``torchx run FILE.py:FN --help`` works: torchx's linter and docstring parser accept them."""

    def test_components_pass_the_torchx_cli_checks(self) -> None:
        for module, fn in [
            (train_components, "train"),
            (train_components, "evaluate"),
            (preprocess_components, "preprocess"),
        ]:
            with self.subTest(fn=fn):
                self.validate(module, fn)


@pytest.mark.slow
def test_cli_arguments_reach_the_appdef() -> None:
    """The file form that .torchxconfig names, fed CLI strings as `torchx run` does."""
    component = get_component(f"{REPO}/torchx_components/train.py:train")
    app = materialize_appdef(
        component.fn,
        ["--config", "synthetic", "-j", "2x4", "--gpu", "4", "--cpu", "32", "--memMB", "64000",
         "--env", "NCCL_DEBUG=INFO,FOO=bar", "--max_retries", "3", "--rdzv_port", "29600",
         "--mounts", "type=bind,src=/data,dst=/data", *TRICKY],
    )
    (role,) = app.roles
    assert role.num_replicas == 2 and role.max_retries == 3
    assert (role.resource.cpu, role.resource.gpu, role.resource.memMB) == (32, 4, 64000)
    assert role.env["NCCL_DEBUG"] == "INFO" and role.env["FOO"] == "bar"
    assert role.port_map == {"c10d": 29600}
    assert [(m.src_path, m.dst_path) for m in role.mounts] == [("/data", "/data")]
    argv = shlex.split(role.args[1])
    assert _program(argv) == ["-m", MODULE, "--config", "synthetic", *TRICKY]
    assert _flag(argv, "--nproc_per_node") == "4" and _flag(argv, "--nnodes") == "2"


def test_train_appdef() -> None:
    env = {"NCCL_DEBUG": "INFO"}
    app = train(*TRICKY, config="criteo.yaml", j="3x2", cpu=8, gpu=2, memMB=4096,
                image="registry/shadowsync:1", env=env, max_retries=2,
                check="none")  # a config file that only the image holds
    (role,) = app.roles
    assert (role.entrypoint, role.image) == ("bash", "registry/shadowsync:1")
    assert (role.num_replicas, role.min_replicas, role.max_retries) == (3, 3, 2)
    assert (role.resource.cpu, role.resource.gpu, role.resource.memMB) == (8, 2, 4096)
    assert role.env["NCCL_DEBUG"] == "INFO"
    assert env == {"NCCL_DEBUG": "INFO"}, "the caller's env dict must not change"
    launcher, argv = shlex.split(role.args[1])[:3], shlex.split(role.args[1])[3:]
    assert launcher == ["python", "-m", LAUNCHER] and _flag(argv, "--rdzv_backend") == "c10d"
    assert _program(argv) == ["-m", MODULE, "--config", "criteo.yaml", *TRICKY]


def test_train_needs_a_gpu_per_rank() -> None:
    with pytest.raises(ValueError, match="processes per node"):
        train(j="1x8", gpu=4, check="config")


def test_evaluate_appdef() -> None:
    (role,) = evaluate("eval.batch_size=8192", checkpoint="/ckpt/step 100", j="1x4",
                       check="config").roles
    assert _program(shlex.split(role.args[1])) == [  # the checkpoint's own config
        "-m", "shadowsync.pipelines.evaluate", "--checkpoint", "/ckpt/step 100",
        "eval.batch_size=8192",
    ]
    (role,) = evaluate(checkpoint="/ckpt", config="movielens_1m", check="config").roles
    assert _program(shlex.split(role.args[1]))[-2:] == ["--config", "movielens_1m"]


@pytest.mark.parametrize(("component", "kwargs"), [
    (train, {}), (evaluate, {"checkpoint": "/ckpt"}),
])
def test_bad_settings_are_refused_before_submission(component: Any, kwargs: dict[str, Any],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError) as caught:
        component("train.bach_size=1024", config="synthetic", **kwargs)
    assert caught.value.code == 2  # type: ignore[attr-defined]  # torchx run exits 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown setting train.bach_size;") and err.count("\n") == 1
    # check=none submits what only the image could judge
    assert component("train.bach_size=1024", config="synthetic", check="none", **kwargs).roles


def test_submit_check_opens_the_data_set_and_plans_for_the_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad_data = "data.name=no_such_data"
    assert train(bad_data, config="synthetic", check="config").roles
    with pytest.raises(ValueError):
        train(bad_data, config="synthetic")
    assert "no_such_data" in capsys.readouterr().err
    # the plan is made for the job's device, not this machine's: row-wise needs CUDA
    row_wise = "sharding.types=[table_row_wise]"
    assert train(row_wise, config="synthetic", j="2x2", gpu=2).roles
    with pytest.raises(ValueError):
        train(row_wise, config="synthetic", j="2x2")
    assert capsys.readouterr().err.startswith("error: sharding.types: ['table_row_wise'] need CUDA")
    with pytest.raises(ValueError, match="check='some'"):
        train(config="synthetic", check="some")


@pytest.mark.parametrize("override", [
    "output_dir=/proc/shadowsync_out", "checkpoint.dir=/proc/${app_id}/ckpt",
])
def test_submit_check_refuses_a_folder_the_job_cannot_write(
    override: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """/proc takes no new entries, even from root; ``${app_id}`` is torchx's, expanded at
    launch, so the folder above it is what is checked."""
    with pytest.raises(ValueError) as caught:
        train(override, config="synthetic")
    assert caught.value.code == 2  # type: ignore[attr-defined]
    key, _, url = override.partition("=")
    reason = "(No such file or directory)"
    assert capsys.readouterr().err == f"error: {key}: {url} is not writable {reason}\n"
    assert train(override, config="synthetic", check="config").roles


@pytest.mark.slow
def test_torchx_run_refuses_a_bad_setting_in_one_line(tmp_path: Path) -> None:
    """The README's promise: a bad key fails before any process starts, with exit code 2."""
    logs = tmp_path / "logs"
    cmd = [str(VENV_BIN / "torchx"), "run", "--scheduler_args", f"log_dir={logs}",
           "--", "--config", "movielens_1m", "train.bach_size=1024"]
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if "INFO" not in line]
    assert len(errors) == 1 and errors[0].startswith("error: unknown setting train.bach_size")
    assert "local_cwd://" not in proc.stdout and not logs.exists()  # nothing was submitted


def test_preprocess_appdef() -> None:
    app = preprocess("/data/day_0.gz", "/data/-odd name", out="/shared/npy",
                     num_embeddings="40000000", on_bad_row="skip", memMB=16000)
    (role,) = app.roles
    assert role.entrypoint == "python" and role.num_replicas == 1
    assert role.args == [
        "-m", "shadowsync.datasets.criteo_preprocess", "--out", "/shared/npy",
        "--num-embeddings", "40000000", "--on-bad-row", "skip", "--",
        "/data/day_0.gz", "/data/-odd name",
    ]
    assert (role.resource.cpu, role.resource.gpu, role.resource.memMB) == (2, 0, 16000)
    with pytest.raises(ValueError, match="input"):
        preprocess(out="/x")


@pytest.mark.slow
def test_local_cwd_dryrun(fake_bin: Path) -> None:
    with get_runner() as runner:
        info = runner.dryrun(train(*TRICKY, check="config"), "local_cwd",
                             cfg={"log_dir": str(fake_bin)})
    (replica,) = info.request.role_params["train"]
    argv = _torchrun_argv(replica.args, fake_bin, replica.env)
    # one node: torchrun picks a free port itself (no clash between concurrent jobs)
    assert _flag(argv, "--rdzv_endpoint") == "localhost:0"
    assert _program(argv) == ["-m", MODULE, "--config", "movielens_1m", *TRICKY]
    # rank 0's summary names the replica's log folder: torchx tells the launcher, it the ranks
    env = dict(replica.env)
    launch.name_log_dir(env)
    (folder,) = info.request.role_log_dirs["train"]
    assert logs(env) == f"{folder} (stdout.log, stderr.log)"


@pytest.mark.slow
def test_slurm_dryrun(fake_bin: Path) -> None:
    app = train(*TRICKY, j="2x4", cpu=16, gpu=4, memMB=64000, env={"NCCL_DEBUG": "INFO"},
                check="config")
    with get_runner() as runner:
        info = runner.dryrun(app, "slurm", cfg={"partition": "gpu", "time": "60"})
    script = info.request.materialize()
    groups = [line.split()[1:] for line in script.splitlines() if line.startswith("#SBATCH --")]
    assert len(groups) == 2  # one heterogeneous job group per node
    for group in groups:
        assert {"--cpus-per-task=16", "--mem=64000", "--gpus-per-task=4"} <= set(group), group
    (fake_bin / "sbatch.sh").write_text(script)
    node_env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST_HET_GROUP_0": "node7"}
    _run_shell(["bash", "sbatch.sh"], fake_bin, node_env, fake_bin)
    srun = _argv(fake_bin, "srun")
    groups = [srun[:srun.index(":")], srun[srun.index(":") + 1:]]
    for group in groups:
        assert "--export=ALL," in " ".join(group) and "NCCL_DEBUG=INFO" in " ".join(group)
        argv = _torchrun_argv(group[group.index("bash"):], fake_bin, node_env)
        assert _flag(argv, "--rdzv_endpoint") == "node7:29500"
        assert _flag(argv, "--rdzv_id") == "4242"
        assert _program(argv) == ["-m", MODULE, "--config", "movielens_1m", *TRICKY]
        export = next(a for a in group if a.startswith("--export="))[len("--export="):]
        env = dict(kv.split("=", 1) for kv in export.split(",")[1:])
        assert logs(env) == "torchx log slurm://torchx/4242"  # the summary's logs line


@pytest.mark.slow
def test_kubernetes_dryrun(fake_bin: Path) -> None:
    pytest.importorskip("kubernetes", reason="torchx renders Kubernetes pods with the kubernetes "
                                             "client; it is not installed")
    app = train(*TRICKY, j="2x8", cpu=64, gpu=8, memMB=500000, image="registry/shadowsync:1",
                mounts=["type=volume", "src=shadowsync-shared", "dst=/shared"], check="config")
    with get_runner() as runner:
        info = runner.dryrun(app, "kubernetes", cfg={"queue": "default"})
    tasks = info.request.resource["spec"]["tasks"]
    assert len(tasks) == 2  # one pod per node
    for task in tasks:
        (container,) = task["template"].spec.containers
        assert container.image == "registry/shadowsync:1"
        assert container.resources.limits == {
            "cpu": "64000m", "memory": "500000M", "nvidia.com/gpu": "8"
        }
        assert "/shared" in [m.mount_path for m in container.volume_mounts]
        env = {e.name: e.value for e in container.env}
        name = info.request.resource["metadata"]["name"]
        assert logs(env) == f"torchx log kubernetes://torchx/<namespace>:{name}"
        env["VC_TRAIN_0_HOSTS"] = "train-0.svc"  # what Volcano's svc plugin gives other pods
        argv = _torchrun_argv(container.command, fake_bin, env)
        assert _flag(argv, "--rdzv_endpoint") in ("localhost:29500", "train-0.svc:29500")
        assert _program(argv) == ["-m", MODULE, "--config", "movielens_1m", *TRICKY]


@pytest.mark.slow
@pytest.mark.parametrize("image", [None, "registry/shadowsync:cuda"])
def test_local_docker_dryrun_runs_the_image(fake_bin: Path, image: str | None) -> None:
    """No docker daemon is needed to render the job; the default image is the one the
    documented build tags."""
    app = train(*TRICKY, check="config", **({} if image is None else {"image": image}))
    with get_runner() as runner:
        info = runner.dryrun(app, "local_docker", cfg={})
    (container,) = info.request.containers
    assert container.image == (image or "shadowsync:latest")
    argv = _torchrun_argv(container.command, fake_bin, container.kwargs["environment"])
    assert _program(argv) == ["-m", MODULE, "--config", "movielens_1m", *TRICKY]


def test_image_recipe_installs_through_install_sh() -> None:
    """docker/Dockerfile (CI has no docker daemon to build it): the one install path, the
    default image's tag, and the PATH that the rendered ``bash -c "torchrun ..."`` needs."""
    recipe = (REPO / "docker" / "Dockerfile").read_text()
    lines = recipe.splitlines()
    workdir = next(line.split()[1] for line in lines if line.startswith("WORKDIR "))
    assert any(line.startswith("RUN ") and "bash scripts/install.sh" in line for line in lines)
    assert "VENV=${VENV:-.venv}" in (REPO / "scripts" / "install.sh").read_text()
    assert f"ENV PATH={workdir}/.venv/bin:$PATH" in lines
    assert f"-t {train_components.DEFAULT_IMAGE} " in recipe


@pytest.fixture
def venv_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """local_cwd starts ``bash -c "torchrun ..."`` with this process's PATH."""
    monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")


def _wait(runner: Runner, handle: str, timeout_s: float = RUN_TIMEOUT_S) -> AppStatus:
    return wait_for_app(runner, handle, timeout_s)  # type: ignore[no-any-return]


def _summary(out_dir: Path) -> dict[str, Any]:
    lines = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines and lines[-1].get("summary") is True, lines
    return lines[-1]


@pytest.mark.slow
def test_torchx_run_trains_two_ranks(tmp_path: Path) -> None:
    """`torchx run -- --config ... OVERRIDES` from the repo root: .torchxconfig picks local_cwd
    and our component (the first component argument must be an option, or torchx takes it for a
    component name)."""
    out = tmp_path / f"out dir; touch {tmp_path}/pwned 'q'"
    cmd = [str(VENV_BIN / "torchx"), "run", "--scheduler_args", f"log_dir={tmp_path / 'logs'}",
           "--", "--config", "synthetic", *SHORT, "train.log_every=20", f"output_dir={out}"]
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # torchx cancels its local jobs on the way out
        log, _ = proc.communicate(timeout=30)
        pytest.fail(f"torchx run still running after {RUN_TIMEOUT_S}s:\n{log[-4000:]}")
    assert proc.returncode == 0, log[-4000:]
    assert "Job finished: SUCCEEDED" in log, log[-4000:]
    assert _summary(out)["step"] == 40
    assert (out / "config.yaml").is_file()
    assert not (tmp_path / "pwned").exists()
    # no terminal: a line a person reads every log_every steps, the digits in metrics.jsonl
    assert re.search(r"\[0\]:.* step 20/40 \| loss \d\.\d{4} \| NE \d\.\d{4} \| AUC \d\.\d{4} \| "
                     r"[\d,]+ ex/s \| sync gap \d+\.\d \| ETA \d+:\d\d:\d\d\n", log), log[-4000:]
    assert '{"step"' not in log
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [20, 40]
    assert all(time.time() - 600 < r["time"] <= time.time() for r in records)
    assert re.search(rf"\[0\]:metrics +{re.escape(str(out / 'metrics.jsonl'))}\n", log)
    handle = re.search(r"^local_cwd://torchx/(\S+)$", log, re.M)  # torchx prints it first
    assert handle is not None, log[:2000]
    folder = tmp_path / "logs" / "torchx" / handle.group(1) / "train" / "0"
    assert re.search(rf"\[0\]:logs +{re.escape(str(folder))} \(stdout.log, stderr.log\)\n", log)
    # TorchRec's planner is built its own way: none of its deprecation warnings
    assert "TopologyFactory" not in log and "StorageReservation" not in log


@pytest.mark.slow
@pytest.mark.usefixtures("venv_on_path")
def test_two_nodes_meet_through_c10d_rendezvous(tmp_path: Path) -> None:
    """``-j 2x1`` on local_cwd: two torchrun agents (one per "node") rendezvous on a free port;
    ``${app_id}`` in an override is expanded by torchx."""
    app = train(*SHORT, f"output_dir={tmp_path}/${{app_id}}", config="synthetic", j="2x1",
                rdzv_port=get_free_port(),
                env={"OMP_NUM_THREADS": "1"})  # the two "nodes" share 2 cores
    with get_runner() as runner:
        handle = runner.run(app, "local_cwd", cfg={"log_dir": str(tmp_path / "logs")})
        status = _wait(runner, handle)
        log = "".join(runner.log_lines(handle, "train", k=0))
    assert status.state == AppState.SUCCEEDED, log[-4000:]
    app_id = handle.rsplit("/", 1)[-1]
    assert _summary(tmp_path / app_id)["step"] == 40


FAILING_RANK = textwrap.dedent("""\
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 gave up on purpose")
    dist.barrier()  # rank 0 waits for a peer that is gone until torchrun stops it
""")


@pytest.mark.slow
@pytest.mark.usefixtures("venv_on_path")
def test_failing_rank_fails_the_job_with_its_error(tmp_path: Path) -> None:
    (tmp_path / "failing_rank.py").write_text(FAILING_RANK)
    app = train(*SHORT, config="synthetic", m="failing_rank", env={"PYTHONPATH": str(tmp_path)})
    with get_runner() as runner:
        handle = runner.run(app, "local_cwd", cfg={"log_dir": str(tmp_path / "logs")})
        status = _wait(runner, handle, timeout_s=90)
        lines = list(runner.log_lines(handle, "failing_rank", k=0))
    assert status.state == AppState.FAILED
    # torchrun --tee prefixes each rank's output with [local rank]
    assert any(line.startswith("[1]:") and "rank 1 gave up on purpose" in line
               for line in lines), "".join(lines)[-4000:]
    assert "Root Cause" in "".join(lines)


@pytest.mark.slow
@pytest.mark.usefixtures("venv_on_path")
def test_preprocess_runs_the_criteo_cli(tmp_path: Path) -> None:
    from shadowsync.datasets.synthetic import SyntheticCriteo, write_criteo_tsv

    day = tmp_path / "in dir" / "day_0"
    day.parent.mkdir()
    write_criteo_tsv(SyntheticCriteo(num_embeddings=1000, num_train_examples=4096), str(day), 500)
    app = preprocess(str(day), out=str(tmp_path / "npy"), num_embeddings="1000")
    with get_runner() as runner:
        handle = runner.run(app, "local_cwd", cfg={"log_dir": str(tmp_path / "logs")})
        status = _wait(runner, handle, timeout_s=90)
        log = "".join(runner.log_lines(handle, "criteo_preprocess", k=0))
    assert status.state == AppState.SUCCEEDED, log[-4000:]
    assert "500 rows" in log
    assert {"day_0_dense.npy", "day_0_sparse.npy", "day_0_labels.npy"} <= {
        p.name for p in (tmp_path / "npy").iterdir()
    }
