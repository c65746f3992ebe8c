"""The SQL builder: dialects as data, the selection, the per-minute bucket and rollup view, the tick's,
the backtest's and the write's statements.
"""
