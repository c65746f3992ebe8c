"""Checks that a statement is GoogleSQL, not just something sqlglot's BigQuery reader tolerates.

sqlglot passes unknown functions through in `bigquery` mode (as exp.Anonymous),
and the BigQuery emulator is DuckDB underneath, so a rendering that calls a
DuckDB-only function such as `isfinite()` would parse, transpile and run in
every local test and fail only in production. `assert_googlesql` closes that
gap: the statement must parse as BigQuery, hold no function sqlglot does not
know, and call every function by a name GoogleSQL defines.
"""

from __future__ import annotations

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.bigquery import BigQuery
from sqlglot.tokens import TokenType

from lossspike.sql.dialects import BIGQUERY, Query
from lossspike.stores.duckdb import DuckDBStore

# GoogleSQL function names, from "All functions" of the GoogleSQL for BigQuery reference
# (https://cloud.google.com/bigquery/docs/reference/standard-sql/functions-all) and its
# mathematical-functions page, plus ROW_NUMBER from its numbering functions
# (https://cloud.google.com/bigquery/docs/reference/standard-sql/numbering_functions), and LPAD and
# TRANSLATE from its string functions
# (https://cloud.google.com/bigquery/docs/reference/standard-sql/string_functions).
# Only names, not signatures: a subset wide enough for what a
# tick, a backtest, a write or a rollup plausibly calls; add a name when a statement needs it
# (after checking it on that page).
GOOGLESQL_FUNCTIONS = frozenset(
    """
    ABS ACOS ANY_VALUE APPROX_COUNT_DISTINCT APPROX_QUANTILES ARRAY ARRAY_AGG ARRAY_CONCAT
    ARRAY_LENGTH ARRAY_TO_STRING AVG BIT_AND BIT_OR CAST CEIL CEILING COALESCE CONCAT COUNT
    COUNTIF CURRENT_DATE CURRENT_TIMESTAMP DATE DATE_ADD DATE_DIFF DATE_SUB DATE_TRUNC DIV
    ENDS_WITH EXP EXTRACT FLOOR FORMAT FORMAT_TIMESTAMP GENERATE_ARRAY GENERATE_TIMESTAMP_ARRAY
    GREATEST IEEE_DIVIDE IF IFNULL IS_INF IS_NAN LEAST LENGTH LN LOG LOG10 LOGICAL_AND LPAD
    LOGICAL_OR LOWER MAX MAX_BY MIN MIN_BY MOD NULLIF PARSE_TIMESTAMP POW POWER RAND
    RANGE_BUCKET REGEXP_CONTAINS REPLACE ROUND ROW_NUMBER SAFE_ADD SAFE_CAST SAFE_DIVIDE SAFE_MULTIPLY
    SAFE_NEGATE SAFE_SUBTRACT SIGN SPLIT SQRT STARTS_WITH STDDEV STDDEV_POP STDDEV_SAMP
    STRING STRING_AGG STRUCT SUBSTR SUM TIMESTAMP TIMESTAMP_ADD TIMESTAMP_DIFF
    TIMESTAMP_MICROS TIMESTAMP_MILLIS TIMESTAMP_SECONDS TIMESTAMP_SUB TIMESTAMP_TRUNC TRANSLATE TRIM
    TRUNC UNIX_MICROS UNIX_MILLIS UNIX_SECONDS UNNEST UPPER VAR_POP VAR_SAMP VARIANCE
    """.split()  # noqa: SIM905 (a word list reads better than 100 quoted strings)
)

# Keywords the BigQuery tokenizer reads as plain names where a parenthesis follows them.
_SYNTAX_BEFORE_PARENTHESES = frozenset({"VALUES"})


def function_names(sql: str) -> list[str]:
    """Every name called like a function (`NAME(`), in the order written, as spelled."""
    tokens = BigQuery().tokenize(sql)
    return [
        token.text
        for token, following in zip(tokens, tokens[1:], strict=False)
        if token.token_type == TokenType.VAR
        and following.token_type == TokenType.L_PAREN
        and token.text.upper() not in _SYNTAX_BEFORE_PARENTHESES
    ]


def googlesql_problems(sql: str) -> list[str]:
    """Why `sql` is not a GoogleSQL statement sqlglot fully understands; empty when it is."""
    try:
        trees = sqlglot.parse(sql, read="bigquery", error_level=sqlglot.ErrorLevel.RAISE)
    except sqlglot.errors.ParseError as error:
        return [f"does not parse as BigQuery: {error}"]
    problems = []
    for tree in trees:
        if tree is None:
            continue
        for node in tree.find_all(exp.Anonymous, exp.AnonymousAggFunc):
            problems.append(f"function unknown to sqlglot's BigQuery dialect: {node.sql(dialect='bigquery')}")
    for name in function_names(sql):
        if name.upper() not in GOOGLESQL_FUNCTIONS:
            problems.append(f"not a GoogleSQL function name: {name}")
    return problems


def assert_googlesql(sql: str) -> None:
    """Fail naming every function BigQuery would not know."""
    problems = googlesql_problems(sql)
    assert not problems, "\n".join(problems) + "\n--- statement ---\n" + sql


class TranspiledBigQuery(DuckDBStore):
    """A BigQuery source for local tests: checks each statement is GoogleSQL, then runs it on DuckDB.

    sqlglot transpiles the BigQuery text; the check comes first because the
    transpiler would happily carry a DuckDB function through.
    """

    dialect = BIGQUERY

    def fetch(self, query: Query, deadline: object = None) -> pa.Table:
        assert_googlesql(query.sql)
        tree = sqlglot.parse_one(query.sql, read="bigquery")
        # Every placeholder is a named parameter we bind, and nothing else is data.
        assert {p.name for p in tree.find_all(exp.Parameter)} == set(query.params)
        [duck_sql] = sqlglot.transpile(query.sql, read="bigquery", write="duckdb")
        return self.connection.sql(duck_sql, params=query.params).to_arrow_table()
