"""Cloud Function entry point `evaluate`, the target of the every-minute Cloud Scheduler job.

Configuration is read and validated here, once, at cold start: a bad
LOSSSPIKE_* value stops the instance with a message naming the variable.
Every request gets a JSON answer: 4xx for a bad request, 500 with one ERROR
log line for anything that fails, never Flask's plain-text error page.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import flask
import functions_framework

from lossspike.cloud.function import Backend, bigquery_backend, duckdb_backend, handle, preload
from lossspike.config.settings import ConfigError, load_settings

try:
    SETTINGS = load_settings(os.environ)
except ConfigError as error:
    sys.stdout.write(json.dumps({"severity": "ERROR", "message": f"lossspike configuration error: {error}"}) + "\n")
    raise
preload(SETTINGS)

_BACKEND: list[Backend] = []
# Two first requests at once must not build two backends on one DuckDB file.
_BACKEND_LOCK = threading.Lock()


def _backend() -> Backend:
    # Clients are built on the first tick and reused: connections stay warm.
    with _BACKEND_LOCK:
        if not _BACKEND:
            _BACKEND.append(bigquery_backend(SETTINGS) if SETTINGS.backend == "bigquery" else duckdb_backend(SETTINGS))
        return _BACKEND[0]


def _fail(message: str) -> tuple[flask.Response, int]:
    sys.stdout.write(json.dumps({"severity": "ERROR", "message": message}) + "\n")
    sys.stdout.flush()
    return flask.jsonify({"ok": False, "error": message}), 500


@functions_framework.http
def evaluate(request: flask.Request) -> tuple[flask.Response, int]:
    """Evaluate every watched run at the tick's scheduled time and write the verdicts."""
    try:
        backend = _backend()
    except Exception as error:  # noqa: BLE001 - a backend that cannot start fails the tick, visibly
        return _fail(f"lossspike backend unavailable: {type(error).__name__}: {' '.join(str(error).split())}")
    try:
        status, result, reason = handle(request.method, request.headers, SETTINGS, backend)
        if result is None:
            return flask.jsonify({"ok": False, "error": reason}), status
        return flask.jsonify(result.body()), status
    except Exception as error:  # noqa: BLE001 - never Flask's plain-text 500; one ERROR line names it
        return _fail(f"lossspike tick crashed: {type(error).__name__}: {' '.join(str(error).split())}")
