"""lossspike's patches to the PyPI ``bqemulator`` (1.4.0), applied without forking it.

``tools/bqemulator/setup.sh`` copies this file into the emulator's own venv
together with a ``.pth`` file that imports it at interpreter start. Importing
it only registers an import hook; the patches are applied when the emulator
imports ``bqemulator.jobs.executor`` (so pip and other tools in that venv are
unaffected).

Patch: named query parameters in scripts. Real BigQuery binds a request's
named ``@parameters`` in every statement of a multi-statement script; the
emulator's script interpreter binds none of them, so any ``@name`` fails with
DuckDB's "Values were not provided for the following prepared statement
parameters". We bind them through DuckDB prepared parameters, the same way the
interpreter binds script variables: each ``@name`` (a whole ``@name`` token
found by SQLGlot's BigQuery parser, so never inside a string literal and never
an ``@@system`` variable) becomes ``CAST($n AS <declared type>)``. The value is
passed as the request's wire text (leaves as strings, BYTES decoded) and DuckDB
casts it to the declared type: DuckDB's Python binding turns a NaN nested in a
list or struct into NULL, a string cast keeps NaN/inf exact, and the cast also
types NULLs and empty arrays.

Patch: a seedable ``INFORMATION_SCHEMA.JOBS``. bqemulator has no JOBS view.
A query naming ```region-XX`.INFORMATION_SCHEMA.JOBS`` (or ``JOBS_BY_PROJECT``,
optionally ``project``-qualified) reads the ordinary table
:func:`jobs_table` instead, created empty on first use with the view's real
columns (:data:`JOBS_COLUMNS`); tests fill it with ``seed_jobs`` in
``tests/servers/bigquery.py``. The emulator records none of its own jobs there.
"""

from __future__ import annotations

import base64
import contextvars
import functools
import importlib.abc
import importlib.machinery
import re
import sys
from typing import Any

# The module whose import triggers the patches; it imports the interpreter.
_TRIGGER_MODULE = "bqemulator.jobs.executor"
_INTERPRETER_MODULE = "bqemulator.scripting.interpreter"
# The patched emulator release: other versions may rename what we wrap.
PATCHED_VERSION = "1.4.0"

# The JOBS view's columns, names and types as documented at
# https://cloud.google.com/bigquery/docs/information-schema-jobs ("Schema"); the
# RECORD columns' fields follow the REST resources they mirror (ErrorProto,
# TableReference). The rarely used RECORD columns (job_stages, timeline,
# bi_engine_statistics, session_info, query_info, ...) are left out.
JOBS_COLUMNS = (
    ("creation_time", "TIMESTAMP"),
    ("project_id", "STRING"),
    ("project_number", "INT64"),
    ("user_email", "STRING"),
    ("principal_subject", "STRING"),
    ("job_id", "STRING"),
    ("job_type", "STRING"),
    ("statement_type", "STRING"),
    ("priority", "STRING"),
    ("start_time", "TIMESTAMP"),
    ("end_time", "TIMESTAMP"),
    ("query", "STRING"),
    ("state", "STRING"),
    ("reservation_id", "STRING"),
    ("total_bytes_processed", "INT64"),
    ("total_bytes_billed", "INT64"),
    ("total_slot_ms", "INT64"),
    ("total_modified_partitions", "INT64"),
    ("cache_hit", "BOOL"),
    ("parent_job_id", "STRING"),
    ("transaction_id", "STRING"),
    ("labels", "ARRAY<STRUCT<key STRING, value STRING>>"),
    ("error_result", "STRUCT<reason STRING, location STRING, debug_info STRING, message STRING>"),
    ("destination_table", "STRUCT<project_id STRING, dataset_id STRING, table_id STRING>"),
    ("referenced_tables", "ARRAY<STRUCT<project_id STRING, dataset_id STRING, table_id STRING>>"),
    ("dml_statistics", "STRUCT<inserted_row_count INT64, deleted_row_count INT64, updated_row_count INT64>"),
)
# Where the seedable JOBS tables live, one per region, in the queried project.
JOBS_DATASET = "bqemu_information_schema"
# ``[project.]`region-XX`.INFORMATION_SCHEMA.JOBS[_BY_PROJECT]`` with any quoting;
# case-sensitive like BigQuery's INFORMATION_SCHEMA view names (same doc, "Note").
_JOBS_VIEW = re.compile(
    r"(?:`?(?P<project>[A-Za-z0-9_:-]+)`?\s*\.\s*)?"
    r"`?region-(?P<region>[a-z0-9-]+)`?\s*\.\s*`?INFORMATION_SCHEMA`?\s*\.\s*"
    r"`?JOBS(?:_BY_PROJECT)?\b`?"
)


def jobs_table(project: str, region: str) -> str:
    """The table standing in for ``project``'s ```region-<region>`.INFORMATION_SCHEMA.JOBS``."""
    return f"{project}.{JOBS_DATASET}.jobs_{region.replace('-', '_')}"


def rewrite_jobs_view(sql: str, default_project: str) -> tuple[str, list[str]]:
    """Point every JOBS view reference at its table; also return the tables referenced."""
    tables: list[str] = []

    def replace(match: re.Match[str]) -> str:
        table = jobs_table(match["project"] or default_project, match["region"])
        tables.append(table)
        return f"`{table}`"

    return _JOBS_VIEW.sub(replace, sql), tables


# The running script job's named parameters, by name (None outside a script).
_script_parameters: contextvars.ContextVar[dict[str, dict[str, Any]] | None] = contextvars.ContextVar(
    "lossspike_script_parameters", default=None
)


def _bq_type_sql(parameter_type: dict[str, Any]) -> str:
    """A request parameterType as GoogleSQL type text, e.g. ARRAY<STRUCT<`a` INT64>>."""
    kind = str(parameter_type.get("type", "STRING")).upper()
    if kind == "ARRAY":
        return f"ARRAY<{_bq_type_sql(parameter_type.get('arrayType') or {})}>"
    if kind == "STRUCT":
        fields = ", ".join(
            f"`{field['name']}` {_bq_type_sql(field.get('type') or {})}"
            for field in parameter_type.get("structTypes", [])
        )
        return f"STRUCT<{fields}>"
    return kind


def _wire_value(parameter_type: dict[str, Any], parameter_value: dict[str, Any] | None) -> Any:
    """The request value with every scalar leaf kept as its wire string (BYTES decoded)."""
    kind = str(parameter_type.get("type", "STRING")).upper()
    value = parameter_value or {}
    if kind == "ARRAY":
        element_type = parameter_type.get("arrayType") or {}
        return [_wire_value(element_type, item) for item in value.get("arrayValues") or []]
    if kind == "STRUCT":
        fields = value.get("structValues") or {}
        return {
            field["name"]: _wire_value(field.get("type") or {}, fields.get(field["name"]))
            for field in parameter_type.get("structTypes", [])
        }
    raw = value.get("value")
    if raw is None:
        return None
    if kind == "BYTES":
        return base64.b64decode(raw)
    return str(raw)


def bind_named_parameters(sql: str, values: list[Any], parameters: dict[str, dict[str, Any]]) -> tuple[str, list[Any]]:
    """Replace each ``@name`` of ``parameters`` in one BigQuery statement by a typed positional parameter.

    ``values`` are the statement's positional values so far (the interpreter's
    ``@1..@k`` script variables); ours are appended after them.
    """
    if not parameters or "@" not in sql:
        return sql, values
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read="bigquery")
    except Exception:  # noqa: BLE001 - unparseable: leave the emulator's own error to surface
        return sql, values
    bound = list(values)
    replaced = False
    for node in list(tree.find_all(exp.Parameter)):
        # ``@@error.message`` parses as a Parameter inside a Parameter; the
        # interpreter's ``@1`` placeholders have a numeric literal, not a Var.
        if isinstance(node.parent, exp.Parameter) or not isinstance(node.this, exp.Var):
            continue
        parameter = parameters.get(node.name)
        if parameter is None:
            continue
        parameter_type = parameter.get("parameterType") or {}
        bound.append(_wire_value(parameter_type, parameter.get("parameterValue")))
        declared = exp.DataType.build(_bq_type_sql(parameter_type), dialect="bigquery")
        node.replace(exp.Cast(this=exp.Placeholder(this=str(len(bound))), to=declared))
        replaced = True
    if not replaced:
        return sql, values
    return tree.sql(dialect="bigquery"), bound


def _patch_executor(executor: Any) -> None:
    original_body = executor._run_query_body

    async def create_jobs_tables(tables: list[str], **kwargs: Any) -> None:
        columns = ", ".join(f"{name} {kind}" for name, kind in JOBS_COLUMNS)
        for table in dict.fromkeys(tables):
            for ddl in (
                f"CREATE SCHEMA IF NOT EXISTS `{table.rsplit('.', 1)[0]}`",
                f"CREATE TABLE IF NOT EXISTS `{table}` ({columns})",
            ):
                await original_body(bq_sql=ddl, query_params=None, is_scripted=False, **kwargs)

    @functools.wraps(original_body)
    async def run_query_body(
        *, bq_sql: str, query_params: list[dict[str, Any]] | None, is_scripted: bool, **kwargs: Any
    ) -> Any:
        bq_sql, jobs_tables = rewrite_jobs_view(bq_sql, kwargs["project_id"])
        if jobs_tables:
            await create_jobs_tables(jobs_tables, **kwargs)
        named = {p["name"]: p for p in query_params or () if p.get("name")} if is_scripted else None
        token = _script_parameters.set(named or None)
        try:
            return await original_body(bq_sql=bq_sql, query_params=query_params, is_scripted=is_scripted, **kwargs)
        finally:
            _script_parameters.reset(token)

    executor._run_query_body = run_query_body


def _patch_interpreter(interpreter: Any) -> None:
    original_rewrite = interpreter._rewrite_vars_to_params

    @functools.wraps(original_rewrite)
    def rewrite_vars_to_params(bq_sql: str, frames: Any) -> tuple[str, list[Any]]:
        sql, values = original_rewrite(bq_sql, frames)
        return bind_named_parameters(sql, values, _script_parameters.get() or {})

    interpreter._rewrite_vars_to_params = rewrite_vars_to_params


def apply(executor: Any) -> None:
    """Apply every patch once the emulator's executor module is loaded."""
    if getattr(executor, "_lossspike_patched", False):
        return
    _patch_executor(executor)
    _patch_interpreter(sys.modules[_INTERPRETER_MODULE])
    executor._lossspike_patched = True


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs :func:`apply` right after the executor module has executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _TRIGGER_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            apply(module)

        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Called from the ``.pth`` file: patch now if the executor is loaded, else on its import."""
    if _TRIGGER_MODULE in sys.modules:
        apply(sys.modules[_TRIGGER_MODULE])
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
