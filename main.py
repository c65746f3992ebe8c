"""Cloud Function entry point `evaluate`, the target of the every-minute Cloud Scheduler job.

Configuration is read and validated here, once, at cold start: a bad
LOSSSPIKE_* value stops the instance with a message naming the variable.
"""

from __future__ import annotations

import json
import os
import sys

import flask
import functions_framework

from lossspike.function import Backend, bigquery_backend, duckdb_backend, handle, preload
from lossspike.settings import ConfigError, load_settings

try:
    SETTINGS = load_settings(os.environ)
except ConfigError as error:
    sys.stdout.write(json.dumps({"severity": "ERROR", "message": f"lossspike configuration error: {error}"}) + "\n")
    raise
preload(SETTINGS)

_BACKEND: list[Backend] = []


def _backend() -> Backend:
    # Clients are built on the first tick and reused: connections stay warm.
    if not _BACKEND:
        _BACKEND.append(bigquery_backend(SETTINGS) if SETTINGS.backend == "bigquery" else duckdb_backend(SETTINGS))
    return _BACKEND[0]


@functions_framework.http
def evaluate(request: flask.Request) -> tuple[flask.Response, int]:
    """Evaluate every watched run at the tick's scheduled time and write the verdicts."""
    try:
        backend = _backend()
    except Exception as error:  # noqa: BLE001 - a backend that cannot start fails the tick, visibly
        message = f"lossspike backend unavailable: {type(error).__name__}: {error}"
        sys.stdout.write(json.dumps({"severity": "ERROR", "message": message}) + "\n")
        return flask.jsonify({"ok": False, "error": message}), 500
    status, result, reason = handle(request.method, request.headers, SETTINGS, backend)
    if result is None:
        return flask.jsonify({"ok": False, "error": reason}), status
    return flask.jsonify(result.body()), status
