"""A multi-node rehearsal on one machine: two torchrun "nodes" of one CPU rank each (gloo, a static
rendezvous on localhost), each rank playing its games on its own node's env server, sharing one run
folder. Four steps straight == two steps, both nodes killed, then resume=auto for steps 3 and 4
(docs/env-service.md#multi-node)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
from test_env_service import free_port, start_server, stop_server  # sibling test modules
from test_trainer import comparable, tiny_overrides

from vagen.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]
NODES = 2


def launch_nodes(run_dir: Path, servers: list[str], **extra) -> list[subprocess.Popen]:
    """One torchrun per node (node ranks 0 and 1, one process each); node i's rank reads its env server
    from VAGEN_ENV_REMOTE, as on a cluster where every node runs its own server."""
    master_port = free_port()
    overrides = tiny_overrides(run_dir, **{"trainer.steps": 4, "trainer.save_every": 2, **extra})
    overrides.append("env.remote=${oc.env:VAGEN_ENV_REMOTE}")
    nodes = []
    for node, url in enumerate(servers):
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", "--nproc-per-node=1"]
        launcher += [f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={master_port}"]
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env |= {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "VAGEN_ENV_REMOTE": url}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        command = launcher + ["vagen/train.py", "--config", "configs/frozenlake_tiny.yaml", *overrides]
        nodes.append(
            subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        )
    return nodes


def wait_for(nodes: list[subprocess.Popen], timeout_s: float = 300) -> str:
    """Wait for every node to exit cleanly; return node 0's stdout (rank 0 prints the run's log)."""
    outputs = []
    for node in nodes:
        stdout, stderr = node.communicate(timeout=timeout_s)
        assert node.returncode == 0, stderr.decode()[-3000:]
        outputs.append(stdout.decode())
    return outputs[0]


def kill_nodes(nodes: list[subprocess.Popen]) -> None:
    """SIGKILL every process of every node at once. torchrun starts each rank in a session of its own,
    so killing the agent's process group would leave the ranks training on as orphans."""
    agents = [psutil.Process(node.pid) for node in nodes]
    processes = agents + [child for agent in agents for child in agent.children(recursive=True)]
    for process in processes:
        process.kill()
    for node in nodes:
        node.communicate()
    deadline = time.monotonic() + 30
    while not all(is_dead(process) for process in processes):
        assert time.monotonic() < deadline, "a rank survived SIGKILL"
        time.sleep(0.05)


def is_dead(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # killed, not yet reaped by its new parent
    except psutil.NoSuchProcess:
        return True


def test_two_nodes_killed_and_resumed_log_what_an_uninterrupted_run_logs(tmp_path):
    ports = [free_port() for _ in range(NODES)]
    servers = [start_server(port) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        straight = tmp_path / "straight"
        wait_for(launch_nodes(straight, urls))

        killed = tmp_path / "killed"
        nodes = launch_nodes(killed, urls)
        deadline = time.monotonic() + 300
        while not (killed / "checkpoints" / "step_000002").is_dir():
            assert all(node.poll() is None for node in nodes), nodes[0].stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.05)
        kill_nodes(nodes)  # the whole node: its torchrun agent and its rank
        assert not (killed / "checkpoints" / "step_000004").exists()

        log = wait_for(launch_nodes(killed, urls, **{"trainer.resume": "auto"}))
    finally:
        for server in servers:
            stop_server(server)
    resumed = [comparable(m) for m in read_metrics(killed / "metrics.jsonl")]
    expected = [comparable(m) for m in read_metrics(straight / "metrics.jsonl")]
    assert "step_000002 (step 2)" in log  # steps 3 and 4 were trained by the resumed run
    assert [m["step"] for m in resumed] == [0, 1, 2, 3, 4]
    assert resumed == expected
    assert all(m.get("rollout/env_errors", 0) == 0 for m in expected)
