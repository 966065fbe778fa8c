"""The env service: envs_visual environments played over HTTP, for rollouts in other processes or on other
machines (docs/env-service.md).

    python -m envs_visual.service --host 0.0.0.0 --port 8000

A session is one env: made for an env id and gymnasium.make kwargs, then reset and stepped, then closed
(or expired after `--idle-timeout` seconds unused). Bodies and replies are JSON (values packed by
envs_visual.wire: images as PNG):

  POST   /sessions               {"env_id", "kwargs"}        -> {"session", "attributes", "state"}
  POST   /sessions/{id}/reset    {"seq", "seed", "options"}  -> {"observation", "info", "state"}
  POST   /sessions/{id}/step     {"seq", "action"}           -> {"observation", "reward", "terminated",
                                                                 "truncated", "info", "state"}
  DELETE /sessions/{id}                                      -> {}
  POST   /batch                  {"calls": [{"session", "op": reset | step | close, ...}]}
                                 -> {"results": [{"reply": ...} or {"status", "error"}, ...]}  (in order)
  GET    /health                                             -> {"sessions": n}

`state` holds what the trainer reads after each call: layout_key, describe_state(), state_features() (those
the env has). `seq` numbers a session's calls: a retried call (same seq as the last one) gets the last
reply again instead of running twice, so a client may retry a step whose reply was lost.
Errors: an unknown session is a 404; a bad request (unknown env id, bad kwargs, seed, options or action,
a step before reset, a malformed body) is a 4xx with {"error": one line}; the server keeps serving.
Requests run in uvicorn's thread pool: the session table has one lock and each session its own, so many
rollouts and workers can share a server. kwargs are trusted (a huge map is built as asked): serve your
own trainers, not the internet.
"""

import argparse
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from envs_visual import ENV_IDS
from envs_visual.wire import STATE_ATTRIBUTES, pack, state_of, static_attributes, unpack


class ServiceError(Exception):
    """A request the service refuses: HTTP `status` and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


@dataclass
class Session:
    env: gymnasium.Env
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)
    last_seq: int | None = None
    last_reply: dict[str, Any] | None = None


class SessionStore:
    """Live sessions by id; sessions unused for `idle_timeout_s` are dropped when a session is made."""

    def __init__(self, idle_timeout_s: float = 600.0, max_sessions: int = 4096) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()

    def create(self, env_id: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if env_id not in ENV_IDS:
            raise ServiceError(400, f"unknown env_id {env_id!r}; served: {', '.join(sorted(ENV_IDS))}")
        self.expire()
        if len(self.sessions) >= self.max_sessions:
            raise ServiceError(429, f"{self.max_sessions} sessions open: close some first")
        try:
            env = gymnasium.make(env_id, **unpack(kwargs))
        except Exception as err:  # a bad kwarg surfaces as whatever the env's constructor raises
            raise ServiceError(400, f"{env_id} with {kwargs}: {one_line(err)}") from None
        session_id = uuid.uuid4().hex
        with self.lock:
            self.sessions[session_id] = Session(env)
        return session_id, static_attributes(env.unwrapped)

    def get(self, session_id: str) -> Session:
        with self.lock:
            session = self.sessions.get(session_id)
        if session is None:
            raise ServiceError(
                404, f"unknown session {session_id!r} (closed, expired, or the server restarted)"
            )
        session.last_used = time.monotonic()
        return session

    def close(self, session_id: str) -> None:
        with self.lock:
            session = self.sessions.pop(session_id, None)
        if session is None:
            raise ServiceError(404, f"unknown session {session_id!r}")
        session.env.close()

    def expire(self) -> None:
        deadline = time.monotonic() - self.idle_timeout_s
        with self.lock:
            idle = [k for k, s in self.sessions.items() if s.last_used < deadline and not s.lock.locked()]
            for session_id in idle:
                self.sessions.pop(session_id).env.close()


class CreateBody(BaseModel):
    env_id: str
    kwargs: dict[str, Any] = Field(default_factory=dict)


class ResetBody(BaseModel):
    seq: int | None = None
    seed: int | None = None
    options: dict[str, Any] | None = None


class StepBody(BaseModel):
    seq: int | None = None
    action: int


class Call(BaseModel):
    session: str
    op: Literal["reset", "step", "close"]
    seq: int | None = None
    seed: int | None = None
    options: dict[str, Any] | None = None
    action: int | None = None


class BatchBody(BaseModel):
    calls: list[Call]


def run_call(store: SessionStore, call: Call) -> dict[str, Any]:
    """One reset, step or close of a session; raises ServiceError."""
    if call.op == "close":
        store.close(call.session)
        return {}
    if call.op == "step" and call.action is None:
        raise ServiceError(422, "a step needs an action")
    session = store.get(call.session)
    with session.lock:
        if call.seq is not None and call.seq == session.last_seq:
            return session.last_reply  # a retry of the last call: its reply was lost on the way
        try:
            if call.op == "reset":
                options = None if call.options is None else unpack(call.options)
                observation, info = session.env.reset(seed=call.seed, options=options)
                reply = {}
            else:
                observation, reward, terminated, truncated, info = session.env.step(call.action)
                reply = {
                    "reward": float(reward),
                    "terminated": bool(terminated),
                    "truncated": bool(truncated),
                }
        except Exception as err:  # the env refused this seed, options or action (or a step before reset)
            raise ServiceError(400, f"{call.op}: {one_line(err)}") from None
        reply |= {
            "observation": pack(observation),
            "info": pack(info),
            "state": state_of(session.env.unwrapped),
        }
        session.last_seq, session.last_reply = call.seq, reply
        return reply


def create_app(store: SessionStore | None = None) -> FastAPI:
    """The HTTP app over `store` (a fresh one if None)."""
    store = store or SessionStore()
    app = FastAPI(title="envs_visual env service")

    @app.exception_handler(ServiceError)
    def refused(request: Request, err: ServiceError) -> JSONResponse:
        return JSONResponse({"error": err.reason}, status_code=err.status)

    @app.exception_handler(RequestValidationError)
    def malformed(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()))
        return JSONResponse(
            {"error": f"malformed request at {where}: {first.get('msg', '')}"}, status_code=422
        )

    @app.get("/health")
    def health() -> dict[str, int]:
        return {"sessions": len(store.sessions)}

    # replies are plain JSON already (envs_visual.wire): JSONResponse skips FastAPI's jsonable_encoder walk
    @app.post("/sessions")
    def create(body: CreateBody) -> JSONResponse:
        session_id, attributes = store.create(body.env_id, body.kwargs)
        game = store.get(session_id).env.unwrapped
        state = {name: pack(getattr(game, name)) for name in STATE_ATTRIBUTES if hasattr(game, name)}
        return JSONResponse({"session": session_id, "attributes": attributes, "state": state})

    @app.post("/sessions/{session_id}/reset")
    def reset(session_id: str, body: ResetBody) -> JSONResponse:
        return JSONResponse(run_call(store, Call(session=session_id, op="reset", **body.model_dump())))

    @app.post("/sessions/{session_id}/step")
    def step(session_id: str, body: StepBody) -> JSONResponse:
        return JSONResponse(run_call(store, Call(session=session_id, op="step", **body.model_dump())))

    @app.delete("/sessions/{session_id}")
    def close(session_id: str) -> dict[str, Any]:
        return run_call(store, Call(session=session_id, op="close"))

    @app.post("/batch")
    def batch(body: BatchBody) -> JSONResponse:
        results = []
        for call in body.calls:
            try:
                results.append({"reply": run_call(store, call)})
            except ServiceError as err:
                results.append({"status": err.status, "error": err.reason})
        return JSONResponse({"results": results})

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Serve envs_visual environments over HTTP.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: all)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--idle-timeout", type=float, default=600.0, help="seconds before an unused session is dropped"
    )
    parser.add_argument("--max-sessions", type=int, default=4096, help="sessions open at most")
    args = parser.parse_args()
    app = create_app(SessionStore(args.idle_timeout, args.max_sessions))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
