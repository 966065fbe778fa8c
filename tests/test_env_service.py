"""The env service (envs_visual.service) and its client: equal episodes, the same training metrics as in
process, a server restart mid-rollout ending only the affected episodes, and fuzzed requests answered
with a 4xx while the server keeps serving."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_rollout_manager import ScriptedEngine  # a sibling test module
from test_trainer import comparable, tiny_overrides

import envs_visual  # noqa: F401  (registers the environments)
from envs_visual.remote import EnvServiceError, RemoteEnv, ServiceClient, SessionLost, reset_all, step_all
from envs_visual.service import SessionStore, create_app
from vagen.config import ConfigError, EnvConfig, RolloutConfig, load_config
from vagen.metrics import read_metrics
from vagen.models.loading import load_processor
from vagen.rollout.manager import RolloutManager

REPO = Path(__file__).resolve().parents[1]
FROZENLAKE = "envs_visual/FrozenLake-v0"
GOOD = "<think>go</think><answer>Down, Right</answer>"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    """`python -m envs_visual.service` on localhost:`port`, once it answers."""
    server = subprocess.Popen(
        [sys.executable, "-m", "envs_visual.service", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
            return server
        except httpx.HTTPError:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the env server did not start in 30 s"
            time.sleep(0.1)


def stop_server(server: subprocess.Popen) -> None:
    server.kill()
    server.wait()


@pytest.fixture
def server_url():
    port = free_port()
    server = start_server(port)
    yield f"http://127.0.0.1:{port}"
    stop_server(server)


def test_remote_episode_equals_local_one_attributes_included(server_url):
    kwargs = {"size": 4, "is_slippery": True, "max_steps": 6, "state_view": "egocentric"}
    remote = ServiceClient(server_url).make(FROZENLAKE, kwargs)
    local = gym.make(FROZENLAKE, **kwargs)
    reset_all([remote], [7], [{"dynamics_seed": 3}])  # batched, kept for the reset below
    outcomes = [env.reset(seed=7, options={"dynamics_seed": 3}) for env in (remote, local)]
    for action in [1, 3, 1, 3, 0, 2, 1, 3]:
        (obs_r, *rest_r), (obs_l, *rest_l) = outcomes
        assert np.array_equal(obs_r["image"], obs_l["image"]) and obs_r["text"] == obs_l["text"]
        assert rest_r == rest_l  # reward, terminated, truncated, info: equal, not close
        game_r, game_l = remote.unwrapped, local.unwrapped
        assert game_r.describe_state() == game_l.describe_state()
        assert np.array_equal(game_r.state_features(), game_l.state_features())
        assert game_r.layout_key == game_l.layout_key
        outcomes = [env.step(action) for env in (remote, local)]
    for name in ("action_names", "instruction", "image_legend", "text_legend", "example_facts"):
        assert getattr(remote.unwrapped, name) == getattr(local.unwrapped, name), name
    assert remote.unwrapped.supports_random_start is True
    assert not hasattr(remote.unwrapped, "optimal_plan")  # what the service does not send is absent


def test_in_process_and_remote_runs_log_the_same_metrics(tmp_path, server_url, one_torch_thread):
    from vagen.trainer import train

    runs = {"local": {}, "remote": {"env.remote": server_url}}
    for name, extra in runs.items():
        train(load_config(REPO / "configs/frozenlake_tiny.yaml", tiny_overrides(tmp_path / name, **extra)))
    local, remote = (read_metrics(tmp_path / name / "metrics.jsonl") for name in runs)
    assert [comparable(m) for m in remote] == [comparable(m) for m in local]
    assert len(local) == 3 and local[1]["rollout/env_errors"] == 0 and local[0]["val/env_errors"] == 0


class RestartingEngine(ScriptedEngine):
    """Replies GOOD (two actions) every turn; restarts the env server before the second turn."""

    def __init__(self, tokenizer, restart):
        super().__init__(tokenizer, [GOOD])
        self.restart = restart

    def generate(self, prompts, params):
        if len(self.calls) == 1:
            self.restart()
        return super().generate(prompts, params)


def test_a_server_restart_mid_rollout_ends_only_the_live_episodes(tiny_vlm_path):
    port = free_port()
    servers = [start_server(port)]

    def restart():
        stop_server(servers[-1])
        servers.append(start_server(port))

    try:
        env_cfg = EnvConfig(
            env_id=FROZENLAKE,
            env_kwargs={"size": 4, "max_steps": 20},
            remote=f"http://127.0.0.1:{port}",
            remote_retries=0,
        )
        processor = load_processor(tiny_vlm_path)
        engine = RestartingEngine(processor.tokenizer, restart)
        cfg = RolloutConfig(num_groups=2, group_size=2, max_turns=3, max_new_tokens=16)
        manager = RolloutManager(env_cfg, cfg, engine, processor)
        episodes = manager.collect(manager.seeds.next_train(2, 2)).episodes
        lost = [e for e in episodes if e.end_reason == "env_error"]
        live_at_turn_2 = [e for e in episodes if len(e.turns) >= 2]
        assert lost == live_at_turn_2 and len(lost) >= 1
        assert manager.env_errors == len(lost)
        assert all(e.turns[-1].actions == [] and e.turns[-1].env_reward == 0.0 for e in lost)
        # the next rollout opens new sessions on the restarted server and plays to its end
        again = manager.collect(manager.seeds.next_train(2, 2)).episodes
        assert manager.env_errors == 0 and all(e.end_reason != "env_error" for e in again)
    finally:
        stop_server(servers[-1])


def test_a_failed_reset_drops_its_group_and_is_counted(server_url, tiny_vlm_path, monkeypatch):
    processor = load_processor(tiny_vlm_path)
    env_cfg = EnvConfig(env_id=FROZENLAKE, env_kwargs={"size": 4}, remote=server_url, remote_retries=0)
    cfg = RolloutConfig(num_groups=2, group_size=2, max_turns=1, max_new_tokens=16)
    manager = RolloutManager(env_cfg, cfg, ScriptedEngine(processor.tokenizer, [GOOD]), processor)
    seeds = manager.seeds.next_train(2, 2)
    reset = RemoteEnv.reset

    def lost_for_one_member(env, *, seed=None, options=None):
        if options["dynamics_seed"] == seeds[1].dynamics:  # group 0, member 1
            raise EnvServiceError("no answer")
        return reset(env, seed=seed, options=options)

    monkeypatch.setattr(RemoteEnv, "reset", lost_for_one_member)
    episodes = manager.collect(seeds).episodes
    assert [(e.group, e.member) for e in episodes] == [(1, 0), (1, 1)]
    assert manager.env_errors == 2  # the member whose reset failed, and its group mate


def test_a_lost_session_raises_and_a_reset_reopens_it():
    store = SessionStore()
    client = ServiceClient("http://testserver")
    client.http = TestClient(create_app(store))  # the same httpx API, in process
    env = client.make(FROZENLAKE, {"size": 4})
    env.reset(seed=0)
    store.sessions.clear()  # as after a restart
    with pytest.raises(SessionLost):
        env.step(1)
    observation, _ = env.reset(seed=0)
    assert observation["image"].shape == (112, 112, 3)
    assert len(store.sessions) == 1


def test_a_retried_step_is_not_played_twice():
    app = TestClient(create_app())
    session = app.post("/sessions", json={"env_id": FROZENLAKE, "kwargs": {"size": 4}}).json()["session"]
    app.post(f"/sessions/{session}/reset", json={"seed": 0, "seq": 1})
    first = app.post(f"/sessions/{session}/step", json={"action": 1, "seq": 2}).json()
    retried = app.post(f"/sessions/{session}/step", json={"action": 1, "seq": 2}).json()
    assert retried == first
    third = app.post(f"/sessions/{session}/step", json={"action": 1, "seq": 3}).json()
    assert third["observation"] != first["observation"]  # a new seq moves the player again


def in_process_client(store: SessionStore | None = None) -> tuple[ServiceClient, list[str]]:
    """A client of an in-process app (the same httpx API), and the paths it requests, in order."""
    client = ServiceClient("http://testserver")
    client.http = TestClient(create_app(store))
    paths: list[str] = []
    client.http.event_hooks["request"] = [lambda request: paths.append(request.url.path)]
    return client, paths


def test_step_all_plays_a_turn_in_one_request_per_round_and_the_steps_equal_local_ones():
    client, paths = in_process_client()
    kwargs = {"size": 4, "max_steps": 3}
    remotes = [client.make(FROZENLAKE, kwargs) for _ in range(4)]
    locals_ = [gym.make(FROZENLAKE, **kwargs) for _ in range(4)]
    for seed, (remote, local) in enumerate(zip(remotes, locals_, strict=True)):
        remote.reset(seed=seed)
        local.reset(seed=seed)
    plans = [[1, 2], [0], [], [2, 1, 1, 1]]  # the last runs past max_steps: its 4th action is not played
    paths.clear()
    step_all(remotes, plans)
    assert paths == ["/batch"] * 3
    for plan, remote, local in zip(plans, remotes, locals_, strict=True):
        for action in plan:
            (obs_r, *rest_r), (obs_l, *rest_l) = remote.step(action), local.step(action)
            assert np.array_equal(obs_r["image"], obs_l["image"]) and rest_r == rest_l
            assert remote.unwrapped.describe_state() == local.unwrapped.describe_state()
            if rest_l[1] or rest_l[2]:
                break
    assert paths == ["/batch"] * 3  # every step was played ahead
    step_all(remotes[:1], [[1]])
    with pytest.raises(EnvServiceError, match="step_all played 1"):
        remotes[0].step(2)


def test_a_step_whose_batch_reply_was_lost_is_replayed_not_played_twice():
    client, _ = in_process_client()
    remote, local = client.make(FROZENLAKE, {"size": 4}), gym.make(FROZENLAKE, size=4)
    remote.reset(seed=5)
    local.reset(seed=5)
    request = client.request

    def played_then_lost(method, path, body=None):
        request(method, path, body)
        raise EnvServiceError("the reply was lost")

    client.request = played_then_lost
    step_all([remote], [[2]])
    client.request = request
    (obs_r, *rest_r), (obs_l, *rest_l) = remote.step(2), local.step(2)
    assert np.array_equal(obs_r["image"], obs_l["image"]) and rest_r == rest_l


def test_idle_sessions_expire():
    store = SessionStore(idle_timeout_s=0.0)
    first, _ = store.create(FROZENLAKE, {})
    store.create(FROZENLAKE, {})  # making a session sweeps the idle ones
    assert first not in store.sessions and len(store.sessions) == 1


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
SAFE_KWARGS = st.dictionaries(  # values no env can build a huge map from (sizes are trusted, not fuzzed)
    st.sampled_from(["size", "p", "is_slippery", "tile_style", "state_view", "boxes", "nonsense"]),
    st.none() | st.text(max_size=5) | st.lists(st.text(max_size=3), max_size=2),
    max_size=2,
)


@pytest.fixture(scope="module")
def fuzz_app():
    app = TestClient(create_app(), raise_server_exceptions=False)
    session = app.post("/sessions", json={"env_id": FROZENLAKE, "kwargs": {"size": 4}}).json()["session"]
    return app, session


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(["/sessions", "/batch", "/sessions/{s}/reset", "/sessions/{s}/step", "/nowhere"]),
    body=JSON | st.fixed_dictionaries({"env_id": st.sampled_from([FROZENLAKE, "x"]), "kwargs": SAFE_KWARGS}),
    fields=st.fixed_dictionaries(
        {}, optional={"seed": JSON, "action": JSON, "options": JSON, "seq": JSON, "op": JSON, "session": JSON}
    ),
)
def test_fuzzed_requests_get_a_4xx_reason_and_the_server_keeps_serving(fuzz_app, path, body, fields):
    app, session = fuzz_app
    payload = {**body, **fields} if isinstance(body, dict) else body
    if path == "/batch":
        payload = {"calls": [{"session": session, **fields}]}
    response = app.post(path.format(s=session), json=payload)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert "\n" not in response.json().get("error", response.json().get("detail", ""))
    assert app.get("/health").status_code == 200


def test_a_bad_env_remote_stops_at_start_naming_the_key(tmp_path):
    from vagen.startup import check_run

    for url, message in (("ftp://x", "not an http"), (f"http://127.0.0.1:{free_port()}", "ConnectError")):
        cfg = load_config(None, [f"env.remote={url}", "env.remote_retries=0", f"trainer.run_dir={tmp_path}"])
        with pytest.raises(ConfigError, match=f"'env.remote'.*{message}"):
            check_run(cfg)
    with pytest.raises(ConfigError, match="env.remote_retries"):
        load_config(None, ["env.remote_retries=-1"])
    with pytest.raises(ConfigError, match="env.remote_timeout_s"):
        load_config(None, ["env.remote_timeout_s=0"])
