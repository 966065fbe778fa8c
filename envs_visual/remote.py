"""The client of the env service (envs_visual.service): `RemoteEnv`, a gymnasium.Env whose game runs on
the server; `reset_all` and `step_all`, one request for the resets or steps of many of them.

    client = ServiceClient("http://127.0.0.1:8000", timeout_s=30, retries=2)
    env = client.make("envs_visual/FrozenLake-v0", {"size": 4})
    obs, info = env.reset(seed=0)          # obs["image"]: the same uint8 array as in process

`env.unwrapped` is the proxy itself: it answers the attributes the trainer reads (envs_visual.wire:
action_names, instruction, legends, example_facts, supports_random_start; after each call layout_key,
describe_state(), state_features()), and lacks those the remote env lacks, as a local env would.

Faults: a request that times out or cannot connect is retried `retries` times (backing off 0.25 s,
0.5 s, ...; a retried step is not played twice: the server replays its reply by `seq`), then raises
EnvServiceError. A step of a session the server no longer knows (it restarted, or the session expired)
raises SessionLost at once; a reset opens a new session first, since a reset needs no past.
"""

import time
from typing import Any

import gymnasium
import httpx
import numpy as np

from envs_visual.wire import STATE_METHODS, pack, unpack

BACKOFF_S = 0.25


class EnvServiceError(RuntimeError):
    """The env service did not answer a call (after the retries), or refused it."""


class SessionLost(EnvServiceError):
    """The server does not know the session (404): it restarted, or the session expired."""


class ServiceClient:
    """One HTTP connection pool to one env server, shared by the RemoteEnvs made from it."""

    def __init__(self, url: str, timeout_s: float = 30.0, retries: int = 2) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s)

    def make(self, env_id: str, kwargs: dict[str, Any] | None = None) -> "RemoteEnv":
        return RemoteEnv(self, env_id, kwargs or {})

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON reply; retries transport failures, raises SessionLost on 404, EnvServiceError else."""
        for attempt in range(self.retries + 1):
            try:
                response = self.http.request(method, path, json=body)
                break
            except httpx.TransportError as err:
                if attempt == self.retries:
                    raise EnvServiceError(
                        f"{self.url}{path}: {type(err).__name__} after {attempt + 1} tries"
                    ) from None
                time.sleep(BACKOFF_S * 2**attempt)
        if response.status_code == 404:
            raise SessionLost(f"{self.url}{path}: {_reason(response)}")
        if response.status_code != 200:
            raise EnvServiceError(f"{self.url}{path}: HTTP {response.status_code}: {_reason(response)}")
        return response.json()


def _reason(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error", response.text))
    except ValueError:
        return response.text[:200]


class RemoteEnv(gymnasium.Env):
    """A gymnasium.Env played on an env server (module docstring)."""

    def __init__(self, client: ServiceClient, env_id: str, kwargs: dict[str, Any]) -> None:
        self.client = client
        self.env_id = env_id
        self.kwargs = kwargs
        self._state: dict[str, Any] = {}
        self._prefetched: tuple[tuple, dict[str, Any]] | None = None  # (reset arguments, reply)
        self._planned: list[tuple[int, dict[str, Any]]] = []  # (action, reply) played ahead by step_all
        self._seq = 0
        self._open()

    def _open(self) -> None:
        reply = self.client.request("POST", "/sessions", {"env_id": self.env_id, "kwargs": pack(self.kwargs)})
        self.session = reply["session"]
        self._attributes = unpack(reply["attributes"])
        self._state = unpack(reply["state"])  # before a reset: the attributes alone (layout_key "")
        self.action_space = gymnasium.spaces.Discrete(len(self._attributes["action_names"]))

    def __getattr__(self, name: str) -> Any:
        # called only for names the object lacks: the remote env's attributes and state
        attributes, state = self.__dict__.get("_attributes", {}), self.__dict__.get("_state", {})
        if name in attributes:
            return attributes[name]
        if name in state:
            value = state[name]
            if name in STATE_METHODS:
                return lambda: value.copy() if isinstance(value, np.ndarray) else list(value)
            return value
        if name in attributes.get("state_methods", ()):
            return _needs_reset
        raise AttributeError(f"{self.env_id} on {self.client.url} has no attribute {name!r}")

    def next_call(self, op: str, **arguments: Any) -> dict[str, Any]:
        """The body of this session's next call (a new `seq`)."""
        self._seq += 1
        return {"session": self.session, "op": op, "seq": self._seq, **arguments}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        arguments = {"seed": seed, "options": None if options is None else pack(options)}
        prefetched, self._prefetched = self._prefetched, None
        self._planned = []  # steps played ahead and not taken: the reset starts over anyway
        if prefetched is not None and prefetched[0] == _key(arguments):
            reply = prefetched[1]
        else:
            try:
                reply = self._call("reset", arguments)
            except SessionLost:
                self._open()
                reply = self._call("reset", arguments)
        return self._take(reply), unpack(reply["info"])

    def step(self, action: int):
        if self._planned:
            planned, reply = self._planned.pop(0)
            if planned != int(action):
                self._planned = []
                raise EnvServiceError(
                    f"{self.env_id} on {self.client.url}: step({action}) after step_all played {planned} here"
                )
        else:
            reply = self._call("step", {"action": int(action)})
        observation = self._take(reply)
        return observation, reply["reward"], reply["terminated"], reply["truncated"], unpack(reply["info"])

    def close(self) -> None:
        try:
            self.client.request("DELETE", f"/sessions/{self.session}")
        except EnvServiceError:
            pass  # closing a session the server lost, or cannot reach, is nothing to do

    def _call(self, op: str, arguments: dict[str, Any]) -> dict[str, Any]:
        body = self.next_call(op, **arguments)
        return self.client.request("POST", f"/sessions/{self.session}/{op}", body)

    def _take(self, reply: dict[str, Any]) -> dict[str, Any]:
        self._state = unpack(reply["state"])
        return unpack(reply["observation"])


def _needs_reset() -> None:
    raise gymnasium.error.ResetNeeded("reset the env before reading its state")


def _key(arguments: dict[str, Any]) -> tuple:
    return repr(arguments["seed"]), repr(arguments["options"])


def reset_all(envs: list[Any], seeds: list[int | None], options: list[dict[str, Any] | None]) -> None:
    """Reset the RemoteEnvs among `envs` (others are skipped) in one request per server; each keeps its
    reply for its next `reset(seed=..., options=...)` with the same arguments, so that the caller resets
    every env as usual. A call that fails here is simply made again by that reset (which retries)."""
    by_client: dict[ServiceClient, list[tuple[RemoteEnv, dict[str, Any]]]] = {}
    for env, seed, option in zip(envs, seeds, options, strict=True):
        remote = getattr(env, "unwrapped", None)
        if isinstance(remote, RemoteEnv):
            arguments = {"seed": seed, "options": None if option is None else pack(option)}
            by_client.setdefault(remote.client, []).append((remote, arguments))
    for client, calls in by_client.items():
        try:
            body = {"calls": [env.next_call("reset", **arguments) for env, arguments in calls]}
            results = client.request("POST", "/batch", body)["results"]
        except EnvServiceError:
            continue
        for (env, arguments), result in zip(calls, results, strict=True):
            if "reply" in result:
                env._prefetched = (_key(arguments), result["reply"])


def step_all(envs: list[Any], plans: list[list[int]]) -> None:
    """Play each RemoteEnv's planned actions (others are skipped) ahead of its `step` calls, in one request
    per server per round: round r sends the r-th action of every plan whose earlier steps were played and
    did not end the episode. Each reply waits for the env's next `step(action)` with that action, so the
    caller steps every env as usual, and a step that departs from the plan raises EnvServiceError (the
    server has played the plan). A step this could not play is made by that `step` call itself, with the
    same `seq` when the request failed: the server replays the reply if it did play it."""
    running = []
    for env, plan in zip(envs, plans, strict=True):
        remote = getattr(env, "unwrapped", None)
        if isinstance(remote, RemoteEnv) and plan and not remote._planned:
            running.append((remote, [int(action) for action in plan]))
    for round_ in range(max((len(plan) for _, plan in running), default=0)):
        by_client: dict[ServiceClient, list[tuple[RemoteEnv, int]]] = {}
        for env, plan in running:
            if len(plan) > round_ and len(env._planned) == round_ and not _ended(env._planned):
                by_client.setdefault(env.client, []).append((env, plan[round_]))
        for client, calls in by_client.items():
            try:
                body = {"calls": [env.next_call("step", action=action) for env, action in calls]}
                results = client.request("POST", "/batch", body)["results"]
            except EnvServiceError:
                for env, _ in calls:
                    env._seq -= 1
                continue
            for (env, action), result in zip(calls, results, strict=True):
                if "reply" in result:
                    env._planned.append((action, result["reply"]))


def _ended(planned: list[tuple[int, dict[str, Any]]]) -> bool:
    return bool(planned) and (planned[-1][1]["terminated"] or planned[-1][1]["truncated"])
