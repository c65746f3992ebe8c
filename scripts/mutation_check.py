#!/usr/bin/env python3
"""Plant known bugs in a copy of the repo, one at a time, and report which the tests notice.

Not part of CI (it runs the slow tests once per mutant): run it after changing the
tests or the oracle, and quote its total. Each mutant is one exact text
replacement in `lossspike/` (the replaced text must occur exactly once, so a
mutant that no longer applies fails loudly instead of passing quietly) and
the tests that should catch it. The copy is imported through PYTHONPATH, with
this checkout's .venv python.

    .venv/bin/python scripts/mutation_check.py [--only NAME-SUBSTRING ...] [--skip NAME-SUBSTRING ...] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Each mutant's tests may take this long; the cloud tests start an emulator.
TIMEOUT_SECONDS = 900
# The unmutated run takes every mutant's tests at once: over 15 minutes for the whole list.
BASELINE_TIMEOUT_SECONDS = 3600
# Hypothesis draws differ from run to run; a fixed seed makes the table reproducible.
HYPOTHESIS_SEED = "12"
# Not copied: environments, caches and the git store; .tools is linked, not copied.
SKIP = {".git", ".venv", ".tools", ".hypothesis", ".pytest_cache", ".ruff_cache", "__pycache__", "lossspike.egg-info"}

PROPERTIES = ["tests/test_properties.py"]
EMPTY_RUN_ID = "tests/test_hostile.py::test_an_empty_run_id_is_never_enrolled_whatever_the_pattern"
HOSTILE_UNUSABLE = "tests/test_hostile.py::test_an_unusable_override_row_pages_every_run_it_could_match_and_says_so"
HOSTILE_ARGUMENTS = "tests/test_hostile.py::test_arguments_out_of_range_are_usage_errors_naming_the_range"
INDEXED = "tests/test_overrides.py::test_indexed_matching_equals_trying_every_pattern"
ROLLUP_CLOUD = "tests/test_rollup_cloud.py"
# Defaults on DuckDB, the emulator's raw telemetry and its rollup view: the same rows.
PARITY = "tests/test_parity_cloud.py"
# The detectors' and checks' oracle tests (tests/detector_oracle.py); a mutant lists the
# example test that should catch it first, so -x stops before any property test shrinks.
DETECTORS = "tests/test_detectors.py"
CHECKS = "tests/test_checks.py"
DETECTOR_PROPERTIES = [
    f"{DETECTORS}::test_default_settings_match_the_oracle",
    f"{DETECTORS}::test_per_run_override_thresholds_match_the_oracle",
    f"{DETECTORS}::test_each_detector_alone_and_every_attempt_match_the_oracle",
]
CHECK_PROPERTIES = [f"{CHECKS}::test_checks_match_the_oracle"]
SKIP_PROPERTIES = f"{CHECKS}::test_steps_skipped_counts_the_oracles_episodes"
BACKTEST_CHECKS = "tests/test_backtest.py::test_backtest_check_rows_match_evaluate_at_every_tick"
# Issue 46's edges, each at the boundary and one step past it.
BOUNDARIES = "tests/test_boundaries.py"
FAULTS = "tests/test_publish_faults.py"
HISTORY = "tests/test_load_history.py"
LOAD_HOSTILE = "tests/test_load_hostile.py"
ONSET = "tests/test_onset.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: list[str]


MUTANTS = [
    # --- the checks' pending period and loss_jump's levels (issue 24) ---
    Mutant(
        "pending: one tick fewer than the period",
        "lossspike/rules/checks.py",
        "for k in range(1, thresholds.check_pending_minutes + 1):",
        "for k in range(1, thresholds.check_pending_minutes):",
        [f"{CHECKS}::test_a_check_fires_when_its_condition_held_at_every_tick_of_the_period_and_not_one_fewer"],
    ),
    Mutant(
        "pending: every earlier tick reads now's window (evaluate)",
        "lossspike/evaluation/evaluate.py",
        "        tick = end - k * minutes.MICROS_PER_MINUTE",
        "        tick = end",
        [f"{CHECKS}::test_a_value_gone_stale_at_an_earlier_tick_breaks_the_period", *CHECK_PROPERTIES],
    ),
    Mutant(
        "pending: every earlier tick reads the tick's window (backtest)",
        "lossspike/backtest/check_replay.py",
        "            moment = end - k * minutes.MICROS_PER_MINUTE",
        "            moment = end",
        [BACKTEST_CHECKS],
    ),
    Mutant(
        "pending: loss_jump's earlier ticks read now's hour",
        "lossspike/evaluation/evaluate.py",
        "runs.floors[:, width - k - hour : width - k],\n"
        "            runs.floor_counts[:, width - k - hour : width - k],",
        "runs.floors[:, width - hour : width],\n            runs.floor_counts[:, width - hour : width],",
        [f"{CHECKS}::test_a_sustained_one_nat_jump_pages_loss_jump_once_it_held_the_period", *CHECK_PROPERTIES],
    ),
    Mutant(
        "pending: an override row longer than the settings' is accepted",
        "lossspike/config/overrides.py",
        "pending > base.check_pending_minutes:",
        "pending > base.check_pending_minutes + 1:",
        [f"{CHECKS}::test_an_override_row_sets_one_runs_period_and_a_longer_one_is_refused"],
    ),
    Mutant(
        "loss_jump: the baseline level is its lowest minute floor",
        "lossspike/rules/checks.py",
        "return median(kept[..., split:]), median(kept[..., :split])",
        "return median(kept[..., split:]), np.nanmin(kept[..., :split], axis=-1)",
        [f"{CHECKS}::test_loss_jump_is_not_set_off_by_one_easy_batch_in_the_baseline", *CHECK_PROPERTIES],
    ),
    # --- the bugs ---
    Mutant(
        "rule: >= for > (equality pages)",
        "lossspike/rules/rule.py",
        "floor is not None and floor > limit:",
        "floor is not None and floor >= limit:",
        [*PROPERTIES, "tests/test_rule.py", "tests/test_backtest.py::test_backtest_judged_runs_match_the_oracle"],
    ),
    Mutant(
        "BigQuery rendering calls DuckDB's isfinite()",
        "lossspike/sql/dialects.py",
        '    if_="IF({}, {}, NULL)",\n    finite=_FINITE,',
        '    if_="IF({}, {}, NULL)",\n    finite="isfinite({0}) AND ABS({0}) < 1e150",',
        ["tests/test_dialects.py"],
    ),
    Mutant(
        "BigQuery write stores reference into band",
        "lossspike/sql/write.py",
        "  SELECT {values} FROM UNNEST(@rows) AS source;",
        '  SELECT {values.replace("source.band", "source.reference")} FROM UNNEST(@rows) AS source;',
        ["tests/test_cloud.py::test_tick_end_to_end", "tests/test_rollup_cloud.py"],
    ),
    Mutant(
        "plot draws the recent peak as the floor",
        "lossspike/cli/plot.py",
        "floors.append(_value(None if windows is None else windows.recent_floor))",
        "floors.append(_value(None if windows is None else windows.recent_peak))",
        ["tests/test_plot.py"],
    ),
    # --- our own ---
    Mutant(
        "1e150 itself counted finite",
        "lossspike/sql/dialects.py",
        '_FINITE = "ABS({0}) < 1e150"',
        '_FINITE = "ABS({0}) <= 1e150"',
        PROPERTIES,
    ),
    Mutant(
        # The tick's windows are whole minutes counted back from now (sql.tick.loss_window_query, which
        # drew the edge per row, is now only the rollup tests' reference): a row on a minute's
        # start falls into the minute before, the hour's start moving with the recent window's.
        "recent window starts one instant late (DuckDB's minutes back from now: the hour's start too)",
        "lossspike/sql/dialects.py",
        '    minutes_back="(epoch_us({1}) - epoch_us({0}) - 1) // 60000000 + 1",',
        '    minutes_back="(epoch_us({1}) - epoch_us({0})) // 60000000 + 1",',
        PROPERTIES,
    ),
    Mutant(
        "population stddev instead of sample stddev",
        "lossspike/sql/tick.py",
        '{stat("STDDEV_SAMP", baseline)} AS baseline_stddev',
        '{stat("STDDEV_POP", baseline)} AS baseline_stddev',
        PROPERTIES,
    ),
    Mutant(
        "NaN while warming up reported as warming_up",
        "lossspike/rules/rule.py",
        "    if windows.recent_not_finite > 0:\n        return NOT_FINITE, 1\n",
        "    if windows.recent_not_finite > 0 and windows.baseline_samples >= thresholds.min_baseline_samples:\n"
        "        return NOT_FINITE, 1\n",
        [*PROPERTIES, "tests/test_rule.py"],
    ),
    Mutant(
        "NULL values enroll runs",
        "lossspike/sql/rollup_view.py",
        'kept += ["value IS NOT NULL", "run_id <> \'\'", runs]',
        "kept += [\"run_id <> ''\", runs]",
        PROPERTIES,
    ),
    Mutant(
        "job is the oldest, not the newest",
        "lossspike/sql/dialects.py",
        'newest="arg_max({}, {})",',
        'newest="arg_min({}, {})",',
        PROPERTIES,
    ),
    Mutant(
        "empty cluster not normalised to unknown",
        "lossspike/sql/selection.py",
        "\"COALESCE(NULLIF(cluster, ''), 'unknown') AS cluster\",",
        "\"COALESCE(cluster, 'unknown') AS cluster\",",
        PROPERTIES,
    ),
    Mutant(
        "the backtest's array twin of the rule pages a floor on the band",
        "lossspike/judge/seed_verdicts.py",
        'spiking = windows["recent_floor"] > limit',
        'spiking = windows["recent_floor"] >= limit',
        [
            "tests/test_backtest.py::test_the_rules_array_twin_equals_the_rule",
            "tests/test_backtest.py::test_backtest_judged_runs_match_the_oracle",
        ],
    ),
    Mutant(
        "the backtest's array twin of the rule never reads a run stalled",
        "lossspike/judge/seed_verdicts.py",
        "stalled = (stall_us > 0) & (last_loss_us != minutes.NO_TIME)",
        "stalled = (stall_us < 0) & (last_loss_us != minutes.NO_TIME)",
        ["tests/test_backtest.py::test_the_rules_array_twin_equals_the_rule", "tests/test_backtest.py"],
    ),
    Mutant(
        "the backtest's level-shift screen asks for a whole min_rise of step",
        "lossspike/judge/detectors.py",
        "jump, np.asarray(min_rise) / 2)",
        "jump, np.asarray(min_rise))",
        [f"{DETECTORS}::test_the_level_shift_screen_never_hides_a_shift"],
    ),
    Mutant(
        "the detectors' median takes the lower middle value",
        "lossspike/rules/median.py",
        "return ((low + high) / 2.0)[..., 0]",
        "return low[..., 0]",
        [f"{DETECTORS}::test_the_detectors_median_is_nanmedian_bit_for_bit", *DETECTOR_PROPERTIES],
    ),
    Mutant(
        "backtest baseline one minute short",
        "lossspike/backtest/grid.py",
        "base_start, recent_start = ends - t.baseline_minutes, ends - t.recent_minutes",
        "base_start, recent_start = ends - t.baseline_minutes + 1, ends - t.recent_minutes",
        ["tests/test_backtest.py"],
    ),
    Mutant(
        "DuckDB write stores the floor as the peak",
        "lossspike/base/schema.py",
        "[{k: row[k] for k in ALERT_COLUMNS} for row in rows]",
        '[{k: row["recent_floor" if k == "recent_peak" else k] for k in ALERT_COLUMNS} for row in rows]',
        ["tests/test_properties.py::test_written_alert_rows_match_python_recomputation", "tests/test_cli.py"],
    ),
    Mutant(
        "plot draws the reference as the band",
        "lossspike/cli/plot.py",
        "limits.append(_value(None if windows is None else band(windows, rule)))",
        "limits.append(_value(None if windows is None else reference(windows, rule)))",
        ["tests/test_plot.py"],
    ),
    Mutant(
        "band ignores min_rise when sigma gives more (sum instead of max)",
        "lossspike/rules/rule.py",
        "return level + max(thresholds.min_rise, thresholds.sigma * spread)",
        "return level + thresholds.min_rise + thresholds.sigma * spread",
        [*PROPERTIES, "tests/test_rule.py"],
    ),
    # --- the minute layer and the rollup (issue 8) ---
    Mutant(
        "Chan's merge forgets the share of the second part",
        "lossspike/judge/minutes.py",
        "a.m2 + b.m2 + delta * delta * a.n * share",
        "a.m2 + b.m2 + delta * delta * a.n",
        ["tests/test_rollup.py", "tests/test_backtest.py"],
    ),
    Mutant(
        "a bucket's variance from raw sums, ignoring its base",
        "lossspike/judge/minutes.py",
        "        mean = base + offsets / count\n",
        "        mean = offsets / count\n",
        ["tests/test_rollup.py", "tests/test_backtest.py"],
    ),
    Mutant(
        "the tick read counts every attempt's losses (an explicit attempt list)",
        "lossspike/sql/tick.py",
        "    attempt = attempt_filter(d, selection, params)\n\n    def judged",
        '    attempt = "TRUE"\n\n    def judged',
        ["tests/test_rollup.py", ROLLUP_CLOUD],
    ),
    Mutant(
        "the tick merges the recent minutes into the baseline",
        "lossspike/evaluation/evaluate.py",
        "        base = minutes.merge_slots(runs.grid, 0, hour - width)",
        "        base = minutes.merge_slots(runs.grid, 0, hour)",
        ["tests/test_rollup.py"],
    ),
    Mutant(
        "the rollup view enrolls empty run IDs",
        "lossspike/sql/rollup_view.py",
        """    kept += ["value IS NOT NULL", "run_id <> ''", runs]""",
        """    kept += ["value IS NOT NULL", runs]""",
        [f"{ROLLUP_CLOUD}::test_the_rollup_view_never_enrolls_an_empty_run_id"],
    ),
    Mutant(
        "the raw reads enroll empty run IDs",
        "lossspike/sql/selection.py",
        """*shape_filters(dialect, shape, selection, params), "value IS NOT NULL", "run_id <> ''", runs]""",
        """*shape_filters(dialect, shape, selection, params), "value IS NOT NULL", runs]""",
        ["tests/test_rollup.py", "tests/test_backtest.py", EMPTY_RUN_ID],
    ),
    Mutant(
        "the newest loss time ignores NaN losses",
        "lossspike/sql/rollup_view.py",
        '"last_loss_at": f"MAX({when(is_loss, t)})",',
        '"last_loss_at": f"MAX({when(f\'{is_loss} AND {finite}\', t)})",',
        ["tests/test_rollup.py", "tests/test_rollup_cloud.py"],
    ),
    # --- the sinks: a run pages once (issue 15) ---
    Mutant(
        "the page series is labelled by reason (a change of reason opens a new incident)",
        "lossspike/cloud/monitoring.py",
        'key = (row["cluster"], row["run"])',
        'key = (row["cluster"], row["run"] + ":" + row["reason"])',
        ["tests/test_cloud.py::test_a_change_of_reason_inside_an_episode_is_the_same_series"],
    ),
    Mutant(
        "the heartbeat counts rows, not runs",
        "lossspike/cloud/monitoring.py",
        "(), len(watched))",
        "(), len(runs))",
        ["tests/test_cloud.py::test_a_run_pages_once_whatever_reasons_fire"],
    ),
    Mutant(
        "notify rows page",
        "lossspike/cloud/monitoring.py",
        'if row.get("severity") == PAGE:',
        'if row.get("severity") in (PAGE, NOTIFY):',
        ["tests/test_cloud.py::test_notify_rows_reach_only_the_notice_metric"],
    ),
    Mutant(
        "a silenced loss row silences the run's firing page check",
        "lossspike/cloud/monitoring.py",
        'paging[key] = max(paging.get(key, 0), int(row["value"]))',
        'paging[key] = min(paging.get(key, 1), int(row["value"]))',
        ["tests/test_cloud.py::test_a_silence_of_one_scope_leaves_the_other_paging"],
    ),
    # --- labelled incidents (backtest --labels) and episodes ---
    Mutant(
        "labels: a page at start + deadline does not count",
        "lossspike/backtest/labels.py",
        "t is not None and t <= label.deadline]",
        "t is not None and t < label.deadline]",
        ["tests/test_labels.py"],
    ),
    Mutant(
        "labels: a page starting at end + 60 min is false",
        "lossspike/backtest/labels.py",
        "label.start <= moment <= label.end + AFTERMATH",
        "label.start <= moment < label.end + AFTERMATH",
        ["tests/test_labels.py"],
    ),
    Mutant(
        "episodes: a silenced tick pages",
        "lossspike/backtest/result.py",
        "codes = np.where(history.silenced, -1, history.codes) if history.silenced is not None else history.codes",
        "codes = history.codes",
        ["tests/test_labels.py", "tests/test_backtest.py"],
    ),
    # --- the backtest's replay of the checks ---
    Mutant(
        "backtest checks: an override scoped to another check applies",
        "lossspike/backtest/check_replay.py",
        "scoped[scope] = policies_in_force(self.overrides, key, self.ticks, self.t, scope)",
        "scoped[scope] = policies_in_force(self.overrides, key, self.ticks, self.t)",
        [BACKTEST_CHECKS],
    ),
    Mutant(
        "backtest checks: one policy for every check despite a scoped row",
        "lossspike/backtest/check_replay.py",
        "shared = not any(r.reason is not None and matches(r, *key) for r in self.overrides)",
        "shared = True",
        [BACKTEST_CHECKS],
    ),
    Mutant(
        "backtest checks: read the oldest attempt of the hour",
        "lossspike/backtest/check_replay.py",
        "        uid = uid_list[tick]\n",
        "        uid = uid_list[0] if uid_list[0] is not NO_ATTEMPT else uid_list[tick]\n",
        [BACKTEST_CHECKS],
    ),
    Mutant(
        "backtest checks: a stale evaluation is fresh",
        "lossspike/rules/checks.py",
        "self.at[hi - 1] < end - EVAL_FRESH_MINUTES * MICROS_PER_MINUTE",
        "self.at[hi - 1] < end - 2 * EVAL_FRESH_MINUTES * MICROS_PER_MINUTE",
        [f"{CHECKS}::test_an_evaluation_older_than_thirty_minutes_says_nothing", BACKTEST_CHECKS],
    ),
    Mutant(
        "backtest checks: a page check does not page",
        "lossspike/backtest/result.py",
        "checked = _firing(history, PAGE)",
        "checked = {}",
        ["tests/test_backtest.py::test_the_defaults_page_each_detectors_demo_run_once", "tests/test_labels.py"],
    ),
    Mutant(
        "plot: the trend line one minute old",
        "lossspike/backtest/grid_detectors.py",
        "trend[ticks] = baseline.trend[:, -1]",
        "trend[ticks] = baseline.trend[:, -2]",
        ["tests/test_plot.py::test_plot_draws_level_shifts_trend_aware_band"],
    ),
    Mutant(
        "plot: a check episode ends a tick early",
        "lossspike/cli/plot.py",
        "if last is not None and spans[last][3] == i - 1:",
        "if last is not None and spans[last][3] == i - 2:",
        ["tests/test_plot.py::test_plot_marks_check_episodes_with_their_reason"],
    ),
    Mutant(
        "a failed rollup refresh fails the tick",
        "lossspike/sql/rollup_view.py",
        "EXCEPTION WHEN ERROR THEN\n  SET {REFRESH_FAILED} = TRUE;",
        "EXCEPTION WHEN ERROR THEN\n  RAISE;",
        ["tests/test_rollup_cloud.py::test_a_failed_refresh_still_gives_the_tick_its_verdict"],
    ),
    Mutant(
        "cost: the view read ignores clustering pruning",
        "lossspike/cost/parts.py",
        "now - timedelta(minutes=end), now, fleet.partition_minutes, pruned\n        )\n        read = roles",
        "now - timedelta(minutes=end), now, fleet.partition_minutes, False\n        )\n        read = roles",
        ["tests/test_cost.py"],
    ),
    # --- issue 17: override rows written wrong, arguments, messages ---
    Mutant(
        "issue 17: an unusable row keeps the silences of the runs it could match",
        "lossspike/config/overrides.py",
        'return RunPolicy(thresholds, silenced and len(usable) == len(candidates), found["note"], found["finished"])',
        'return RunPolicy(thresholds, silenced, found["note"], found["finished"])',
        [
            "tests/test_overrides.py::test_an_unusable_row_lifts_every_silence_of_the_runs_it_could_match",
            f"{HOSTILE_UNUSABLE}[infinity]",
        ],
    ),
    Mutant(
        "issue 17: a refused threshold does not make its row unusable",
        "lossspike/config/overrides.py",
        "found = threshold_problems(SimpleNamespace(**{**merged, column: value}))",
        "found = []",
        ["tests/test_overrides.py::test_invalid_hand_written_threshold_is_reported_and_its_silences_lifted"],
    ),
    # --- issue 25: thresholds that parse but cannot work, unknown reasons, labels files ---
    Mutant(
        "issue 25: a skipped-steps limit of 0 is accepted",
        "lossspike/rules/rule.py",
        '"skipped_steps_limit": Range(\n        low=1,',
        '"skipped_steps_limit": Range(\n        low=0,',
        [
            "tests/test_settings.py::test_a_threshold_that_parses_but_cannot_work_is_refused_with_its_range",
            f"{HOSTILE_UNUSABLE}[skipped steps limit of 0]",
        ],
    ),
    Mutant(
        "issue 25: an override row naming an unknown reason is usable",
        "lossspike/config/overrides.py",
        "return row.reason is None or row.reason in REASON_SCOPES",
        "return True",
        [f"{HOSTILE_UNUSABLE}[reason in capitals]", "tests/test_overrides.py"],
    ),
    Mutant(
        "issue 25: a labels file's byte-order mark is kept",
        "lossspike/backtest/labels.py",
        "text = text.removeprefix(BOM)",
        "text = text",
        ["tests/test_labels.py::test_a_byte_order_mark_is_read_as_the_start_of_utf8_text"],
    ),
    Mutant(
        "issue 25: the labels table prints kinds raw",
        "lossspike/backtest/labels.py",
        'terminal_safe(row["kind"]),',
        'row["kind"],',
        ["tests/test_labels.py::test_the_labels_table_escapes_what_people_and_scripts_typed"],
    ),
    Mutant(
        "issue 17: a pattern ending in a lone backslash counts as usable",
        "lossspike/config/override_patterns.py",
        "    return trailing % 2 == 1",
        "    return False",
        [f"{HOSTILE_UNUSABLE}[pattern ending in a lone backslash]"],
    ),
    Mutant(
        "issue 17: the pattern index misses suffix-anchored patterns",
        "lossspike/config/override_patterns.py",
        "candidates += self.suffix.get(run[size - length :], ())",
        "candidates += self.suffix.get(run[size - length + 1 :], ())",
        [INDEXED],
    ),
    Mutant(
        "issue 17: the pattern index misses an inner literal at the end of a run",
        "lossspike/config/override_patterns.py",
        "            for start in range(size - length + 1):",
        "            for start in range(size - length):",
        [INDEXED],
    ),
    Mutant(
        "issue 17: DuckDB times out of range are read as they are",
        "lossspike/config/override_tables.py",
        'if kind == "TIMESTAMP" and dialect.name == "duckdb":',
        "if False:",
        [f"{HOSTILE_UNUSABLE}[infinity]", f"{HOSTILE_UNUSABLE}[before year 1]"],
    ),
    Mutant(
        "issue 17: a column of the wrong type is read as it is",
        "lossspike/config/override_tables.py",
        "    if stored.strip().upper() not in accepted:",
        "    if False:",
        [
            f"{HOSTILE_UNUSABLE}[time stored as text]",
            "tests/test_rollup_cloud.py::test_an_overrides_table_of_the_wrong_types_pages_and_fails_the_tick",
        ],
    ),
    Mutant(
        "issue 17: a write to an older overrides table does not add the missing column",
        "lossspike/config/override_tables.py",
        'if column["name"] not in stored and column["mode"] == "NULLABLE":',
        "if False:",
        ["tests/test_hostile.py::test_an_overrides_table_missing_a_column"],
    ),
    Mutant(
        "issue 17: the raw BigQuery read caches only the rows written by now",
        "lossspike/stores/bigquery.py",
        "overrides = self._cache_overrides(rows_from_arrow(rows.rename_columns(list(OVERRIDE_TYPES)), problems))",
        "overrides = self._cache_overrides([r for r in rows_from_arrow("
        "rows.rename_columns(list(OVERRIDE_TYPES)), problems) if r.created_at is None or r.created_at <= now])",
        [f"{ROLLUP_CLOUD}::test_a_row_written_after_a_ticks_time_but_before_its_read_counts_from_the_next_tick"],
    ),
    Mutant(
        "issue 17: a job that never finishes fails with a bare TimeoutError",
        "lossspike/stores/bigquery.py",
        "        except TimeoutError as error:",
        "        except ZeroDivisionError as error:",
        [f"{ROLLUP_CLOUD}::test_a_read_started_with_a_nearly_spent_deadline_ends_in_time_and_says_why"],
    ),
    Mutant(
        "issue 17: missing credentials are an unexpected error",
        "lossspike/stores/bigquery.py",
        'raise StoreError(f"cannot open BigQuery: {_one_line(error)}") from None',
        "raise",
        ["tests/test_hostile.py::test_every_bigquery_command_without_credentials_says_so_in_one_line"],
    ),
    Mutant(
        "issue 17: DuckDB's LIKE without an escape character",
        "lossspike/sql/selection.py",
        "\" ESCAPE '\\\\'\" if dialect.name",
        '"" if dialect.name',
        ["tests/test_hostile.py::test_a_backslash_in_the_run_pattern_escapes_the_underscore"],
    ),
    Mutant(
        "issue 17: the tick counts as ok with unusable override rows",
        "lossspike/evaluation/tick.py",
        "and self.unusable_overrides is None",
        "and True",
        ["tests/test_hostile.py::test_the_function_writes_every_verdict_and_answers_500_for_an_unusable_row"],
    ),
    Mutant(
        "issue 17: evaluate exits 0 with unusable override rows",
        "lossspike/cli/run.py",
        'sys.stderr.write(f"lossspike: error: {terminal_safe(unusable)}\\n")\n        return 1',
        'sys.stderr.write(f"lossspike: error: {terminal_safe(unusable)}\\n")\n        return 0',
        [f"{HOSTILE_UNUSABLE}[infinity]"],
    ),
    Mutant(
        "issue 17: a silence may end after year 9999",
        "lossspike/cli/overrides.py",
        "    if int(number) > room:",
        "    if False:",
        [f"{HOSTILE_ARGUMENTS}[args0---for '99999999999d': must be at most]"],
    ),
    Mutant(
        "issue 17: more runs may page than are watched",
        "lossspike/cost/fleet.py",
        '"paging_runs": self.runs}',
        '"paging_runs": math.inf}',
        [f"{HOSTILE_ARGUMENTS}[args6---paging-runs must be a finite number from 0 to 10]"],
    ),
    Mutant(
        "issue 17: the overrides listing prints notes raw",
        "lossspike/cli/overrides.py",
        'sys.stdout.write("".join(terminal_safe(line) + "\\n" for line in out))',
        'sys.stdout.write("".join(line + "\\n" for line in out))',
        ["tests/test_hostile.py::test_notes_and_clusters_cannot_rewrite_the_terminal"],
    ),
    Mutant(
        "issue 17: an SQLite file is handed to DuckDB",
        "lossspike/stores/duckdb.py",
        "if not self._in_memory and _is_sqlite(self.path):",
        "if False:",
        ["tests/test_hostile.py::test_an_sqlite_file_is_named_as_such"],
    ),
    Mutant(
        "issue 17: a locked file gets no advice",
        "lossspike/cli/overrides.py",
        'if "lock" not in str(error).lower():',
        "if True:",
        ["tests/test_hostile.py::test_a_silence_while_the_local_function_holds_the_file_says_what_to_do"],
    ),
    # --- beyond seed: the detectors, the newest attempt and the run-health checks (issues 18, 15) ---
    Mutant(
        "beyond seed: level_shift fits its trend over the whole baseline, not its last minutes",
        "lossspike/judge/detectors.py",
        "    fit = base & (idx >= start - FIT_MINUTES)",
        "    fit = base",
        [
            f"{DETECTORS}::test_a_shift_of_0_3_nats_ninety_minutes_into_a_falling_run_pages_level_shift",
            *DETECTOR_PROPERTIES,
        ],
    ),
    Mutant(
        "beyond seed: level_shift observes the recent minutes' highest rise, not the lowest",
        "lossspike/judge/detectors.py",
        "observed = _quiet(np.nanmin, np.where(recent & data, floors - baseline.trend, np.nan), axis=-1)",
        "observed = _quiet(np.nanmax, np.where(recent & data, floors - baseline.trend, np.nan), axis=-1)",
        [f"{DETECTORS}::test_oracle_catches_a_wrong_threshold", *DETECTOR_PROPERTIES],
    ),
    Mutant(
        "beyond seed: slow_divergence compares with the mean block, not the best",
        "lossspike/judge/detectors.py",
        "    best = _quiet(np.nanmin, blocks, axis=-1)",
        "    best = _quiet(np.nanmean, blocks, axis=-1)",
        [f"{DETECTORS}::test_a_slow_divergence_pages_before_the_seed_rule", *DETECTOR_PROPERTIES],
    ),
    Mutant(
        "beyond seed: slow_divergence's level over five minutes, not ten",
        "lossspike/judge/detectors.py",
        "    tail = means[..., minutes - LEVEL_MINUTES :]",
        "    tail = means[..., minutes - 5 :]",
        [f"{DETECTORS}::test_a_slow_divergence_pages_before_the_seed_rule", *DETECTOR_PROPERTIES],
    ),
    Mutant(
        "beyond seed: instability counts excursion minutes, not episodes",
        "lossspike/judge/detectors.py",
        "    starts = episode_starts(excursions(grid, sigma, min_rise), grid.n > 0)",
        "    starts = excursions(grid, sigma, min_rise)",
        [f"{DETECTORS}::test_three_excursions_in_the_hour_page_instability", *DETECTOR_PROPERTIES],
    ),
    Mutant(
        "beyond seed: instability's spread always between minutes",
        "lossspike/judge/detectors.py",
        "    between = MAD_TO_SIGMA * median(np.abs(before - level[..., None]))\n"
        "    scale = np.nan_to_num(np.where(np.isfinite(within), within, between))",
        "    between = MAD_TO_SIGMA * median(np.abs(before - level[..., None]))\n    scale = np.nan_to_num(between)",
        DETECTOR_PROPERTIES,
    ),
    Mutant(
        "beyond seed: a slow-stepping run's window is not widened",
        "lossspike/evaluation/evaluate.py",
        "    widths = np.where(slow, np.maximum(widths, widened), widths)",
        "    widths = np.where(slow, widths, widths)",
        [
            f"{DETECTORS}::test_a_slow_run_is_judged_on_its_last_three_steps",
            f"{DETECTORS}::test_a_run_at_105_seconds_a_step_pages_a_0_3_shift_within_ten_minutes",
            *DETECTOR_PROPERTIES,
        ],
    ),
    Mutant(
        "beyond seed: the detectors judge every warming_up run",
        "lossspike/evaluation/evaluate.py",
        "    judged = np.array([r == HEALTHY for r in reasons]) | slow",
        "    judged = np.array([r in (HEALTHY, WARMING_UP) for r in reasons]) | slow",
        [f"{DETECTORS}::test_a_run_back_from_a_long_pause_stays_warming_up", *DETECTOR_PROPERTIES],
    ),
    Mutant(
        "beyond seed: newest attempt ties go to the smaller UID",
        "lossspike/judge/minutes.py",
        "    order = np.lexsort((attempt, seq, times, run))",
        "    order = np.lexsort((-attempt, seq, times, run))",
        [f"{CHECKS}::test_the_newest_attempt_is_that_of_the_newest_loss_or_phase_row", *CHECK_PROPERTIES],
    ),
    Mutant(
        "beyond seed: newest attempt from the loss samples only",
        "lossspike/judge/minutes.py",
        "    chosen = newest_attempt(run, hour_codes, attempt_keys, size, seq)",
        '    loss_keys = attempt_key(micros(hour_rows, "last_loss_at"), micros(hour_rows, "sample_at"))\n'
        "    chosen = newest_attempt(run, hour_codes, loss_keys, size, seq)",
        [f"{CHECKS}::test_the_newest_attempt_is_that_of_the_newest_loss_or_phase_row", *CHECK_PROPERTIES],
    ),
    Mutant(
        "beyond seed: checks read every attempt",
        "lossspike/judge/minutes.py",
        '    rows, owner = rows_of("checks", True,',
        '    rows, owner = rows_of("checks", False,',
        [f"{CHECKS}::test_skipped_steps_of_the_previous_attempt_do_not_count", *CHECK_PROPERTIES],
    ),
    Mutant(
        "beyond seed: a check metric's newest value is its oldest minute's",
        "lossspike/rules/checks.py",
        "return MetricMinutes(self.finite[lo:hi], self.sums[lo:hi], self.last[hi - 1], newest_finite)",
        "return MetricMinutes(self.finite[lo:hi], self.sums[lo:hi], self.last[lo], newest_finite)",
        [f"{CHECKS}::test_a_non_finite_gradient_norm_pages_and_a_stale_one_does_not", *CHECK_PROPERTIES],
    ),
    Mutant(
        "beyond seed: grad_norm_high ignores a non-finite newest value",
        "lossspike/rules/checks.py",
        "        if _bad(metric.last) or metric.last > limit:",
        "        if metric.last > limit:",
        [f"{CHECKS}::test_a_non_finite_gradient_norm_pages_and_a_stale_one_does_not", *CHECK_PROPERTIES],
    ),
    Mutant(
        "beyond seed: steps_skipped needs more than the limit",
        "lossspike/rules/checks.py",
        "    if episodes >= limit:",
        "    if episodes > limit:",
        [f"{CHECKS}::test_skipped_steps_of_the_previous_attempt_do_not_count", *CHECK_PROPERTIES],
    ),
    Mutant(
        "steps_skipped: counts skipped steps again, not episodes",
        "lossspike/rules/checks.py",
        "    episodes = skip_episode_starts(metric.finite, metric.sums)",
        "    episodes = int(sum(metric.sums))",
        [f"{CHECKS}::test_one_burst_of_skipped_steps_of_any_size_is_one_episode_and_no_page", SKIP_PROPERTIES],
    ),
    Mutant(
        "steps_skipped: a minute with only non-finite values splits an episode",
        "lossspike/rules/checks.py",
        "        if count:\n            if total > 0 and not skipping:",
        "        if True:\n            if total > 0 and not skipping:",
        [f"{CHECKS}::test_minutes_without_a_skipped_step_value_neither_split_nor_extend_an_episode"],
    ),
    Mutant(
        "steps_skipped: an episode under way when the window opens is not counted",
        "lossspike/rules/checks.py",
        "    starts, skipping = 0, False",
        "    starts, skipping = 0, True",
        [f"{CHECKS}::test_an_episode_under_way_when_the_window_opens_counts_once", SKIP_PROPERTIES],
    ),
    Mutant(
        "beyond seed: eval_regressed on a stale evaluation",
        "lossspike/rules/checks.py",
        "if hi <= lo or self.at[hi - 1] < end - EVAL_FRESH_MINUTES * MICROS_PER_MINUTE:",
        "if hi <= lo:",
        [f"{CHECKS}::test_an_evaluation_older_than_thirty_minutes_says_nothing", *CHECK_PROPERTIES],
    ),
    Mutant(
        "beyond seed: throughput_low observes the mean of the minute means",
        "lossspike/rules/checks.py",
        "        return Fired(reason, CHECKS[reason][0], data.names[key], _median(means), floor)",
        "        return Fired(reason, CHECKS[reason][0], data.names[key], sum(means) / len(means), floor)",
        [f"{CHECKS}::test_throughput_below_its_floor_in_most_minutes_notifies_with_the_median", *CHECK_PROPERTIES],
    ),
    Mutant(
        "beyond seed: token_drops reads a non-finite newest value",
        "lossspike/rules/checks.py",
        "    value = metric.last_finite\n",
        "    value = metric.last\n",
        [f"{CHECKS}::test_notify_checks_read_the_newest_finite_value_of_each_metric", *CHECK_PROPERTIES],
    ),
    Mutant(
        "beyond seed: router_bias reads the upper bound only",
        "lossspike/rules/checks.py",
        '        for key in ("router_bias_max", "router_bias_min")',
        '        for key in ("router_bias_max",)',
        [f"{CHECKS}::test_notify_checks_read_the_newest_finite_value_of_each_metric", *CHECK_PROPERTIES],
    ),
    Mutant(
        "beyond seed: router_entropy fires above the limit",
        "lossspike/rules/checks.py",
        "    if metric.last_finite < limit:",
        "    if metric.last_finite > limit:",
        [f"{CHECKS}::test_notify_checks_read_the_newest_finite_value_of_each_metric", *CHECK_PROPERTIES],
    ),
    Mutant(
        "beyond seed: loss_jump fires beside any loss reason",
        "lossspike/rules/checks.py",
        "    if loss_reason != HEALTHY or data.jump is None:",
        "    if data.jump is None:",
        [f"{CHECKS}::test_loss_jump_fires_beside_a_healthy_loss_row_only", *CHECK_PROPERTIES],
    ),
    Mutant(
        "beyond seed: eval_regressed fires on an evaluation equal to the one before",
        "lossspike/rules/checks.py",
        "    if newest > before:\n        return Fired(EVAL_REGRESSED",
        "    if newest >= before:\n        return Fired(EVAL_REGRESSED",
        [f"{CHECKS}::test_an_evaluation_no_worse_than_the_one_before_says_nothing", *CHECK_PROPERTIES],
    ),
    # --- the raw tick read's history blocks and whole-hour other metrics ---
    Mutant(
        "raw read: a history block names the minutes ten later than its own",
        "lossspike/sql/tick.py",
        "{HISTORY_BLOCK_MINUTES} * block)",
        "{HISTORY_BLOCK_MINUTES} * (block + 1))",
        [f"{DETECTORS}::test_slow_divergence_reads_the_oldest_block_of_its_horizon", *DETECTOR_PROPERTIES],
    ),
    Mutant(
        "raw read: a history block of an empty cluster is not the run's",
        "lossspike/sql/tick.py",
        '        "run_cluster": "COALESCE(NULLIF(cluster, \'\'), \'unknown\')",\n        "run_id": "run_id",\n'
        '        "execution_uid": "execution_uid",\n        # The block',
        '        "run_cluster": "COALESCE(cluster, \'unknown\')",\n        "run_id": "run_id",\n'
        '        "execution_uid": "execution_uid",\n        # The block',
        [f"{DETECTORS}::test_slow_divergence_reads_the_oldest_block_of_its_horizon", *DETECTOR_PROPERTIES],
    ),
    # --- issue 24: instability against the run's own history, resume_jump ---
    Mutant(
        "instability: a spike train need not be new for the run",
        "lossspike/judge/detectors.py",
        "    return (blocks >= MIN_BLOCKS) & (chance <= NEW_TRAIN_CHANCE)\n",
        "    return blocks >= 0\n",
        [f"{DETECTORS}::test_a_run_that_has_always_spiked_does_not_page_instability"],
    ),
    Mutant(
        "instability: the backtest's spike train need not be new for the run",
        "lossspike/backtest/grid_detectors.py",
        "            new = detectors.new_for_run(\n",
        "            new = True or detectors.new_for_run(\n",
        [f"{DETECTORS}::test_a_run_that_has_always_spiked_does_not_page_instability"],
    ),
    Mutant(
        "raw read: a history block's peak is its lowest loss",
        "lossspike/sql/tick.py",
        '        "loss_peak": f"MAX({judged(\'loss_value\')})",',
        '        "loss_peak": f"MIN({judged(\'loss_value\')})",',
        [f"{DETECTORS}::test_a_run_that_has_always_spiked_does_not_page_instability"],
    ),
    Mutant(
        "resume_jump: the previous attempt's history blocks are not a level it held",
        "lossspike/judge/detectors.py",
        "    held = np.maximum(held, np.max(blocks, axis=-1, initial=-np.inf))\n",
        "    held = np.maximum(held, -np.inf)\n",
        [f"{DETECTORS}::test_a_restart_from_a_checkpoint_does_not_page", "tests/test_resume_jump.py"],
    ),
    Mutant(
        "resume_jump: a warming-up run is not judged",
        "lossspike/evaluation/evaluate.py",
        "    judged = np.array([r == HEALTHY for r in reasons]) | slow | (warming & resumes)\n",
        "    judged = np.array([r == HEALTHY for r in reasons]) | slow\n",
        ["tests/test_resume_jump.py"],
    ),
    Mutant(
        "resume_jump: a job that died in its first minutes is the reference",
        "lossspike/judge/minutes.py",
        "RESUME_PREVIOUS_MINUTES = 5\n",
        "RESUME_PREVIOUS_MINUTES = 1\n",
        ["tests/test_resume_jump.py"],
    ),
    Mutant(
        "resume_jump: one step is a level",
        "lossspike/judge/detectors.py",
        "    enough = opening.sum(axis=-1) >= MIN_RECENT_MINUTES\n",
        "    enough = opening.sum(axis=-1) >= 1\n",
        ["tests/test_resume_jump.py"],
    ),
    # --- DuckDB and BigQuery parity with the defaults (tests/test_parity_cloud.py) ---
    Mutant(
        "parity: BigQuery's newest value of a minute is its oldest",
        "lossspike/sql/dialects.py",
        '    newest="MAX_BY({}, {})",',
        '    newest="MIN_BY({}, {})",',
        [PARITY],
    ),
    Mutant(
        "parity: the rollup view buckets to the nearest clock minute",
        "lossspike/sql/dialects.py",
        '    minute="TIMESTAMP_TRUNC({}, MINUTE)",',
        '    minute="TIMESTAMP_TRUNC(TIMESTAMP_ADD({}, INTERVAL 30 SECOND), MINUTE)",',
        [PARITY],
    ),
    Mutant(
        "beyond seed: a check's row takes the loss row's overrides",
        "lossspike/evaluation/evaluate.py",
        "finished_policy(phases[i], by_check[check].get(key, plain), windows_i.last_loss_at)",
        "finished_policy(phases[i], policies[i], windows_i.last_loss_at)",
        [f"{CHECKS}::test_a_checks_threshold_comes_from_its_scoped_override_row", *CHECK_PROPERTIES],
    ),
    # --- issue 36: the read side of real Levanter shapes ---
    Mutant(
        "issue 36: a sample's kind is matched case-sensitively",
        "lossspike/sql/selection.py",
        "(kind IS NULL OR LOWER(kind) IN (",
        "(kind IS NULL OR kind IN (",
        ["tests/test_shapes.py::test_a_sample_kind_in_upper_case_keeps_the_run_watched"],
    ),
    Mutant(
        "issue 36: levanter.metrics' kind is not read",
        "lossspike/sql/selection.py",
        "    if shape.has_kind:\n        kept.append(KIND_SAMPLE)",
        "    if shape.has_kind and shape.has_service:\n        kept.append(KIND_SAMPLE)",
        ["tests/test_shapes.py::test_a_non_scalar_row_with_a_nan_value_never_pages"],
    ),
    Mutant(
        "issue 36: a run stays finished when losses arrive after its FINISHED row",
        "lossspike/rules/phase.py",
        "    return last_loss_at is None or last_loss_at <= state.at",
        "    return True",
        ["tests/test_phase.py::test_a_loss_newer_than_the_finished_row_is_judged_and_pages"],
    ),
    Mutant(
        "issue 34: a default that no longer fits stays and refuses the baseline set alone",
        "lossspike/config/settings.py",
        "    groups[Thresholds] = following_defaults(groups[Thresholds])\n",
        "",
        ["tests/test_settings.py::test_a_baseline_set_alone_takes_the_defaults_that_must_stay_below_it_along"],
    ),
    # --- issue 27: the edges the property tests rarely draw, each with an example test ---
    Mutant(
        "issue 27: level_shift pages a floor exactly at its limit",
        "lossspike/judge/detectors.py",
        "& (observed > limit) & (jump >= limit / 2)",
        "& (observed >= limit) & (jump >= limit / 2)",
        [f"{DETECTORS}::test_a_level_shift_exactly_at_its_limit_does_not_page_and_one_ulp_more_does"],
    ),
    Mutant(
        "issue 27: level_shift takes a fall into the window for the step of a shift",
        "lossspike/judge/detectors.py",
        "jump = _quiet(np.nanmax, np.where(near, steps, np.nan), axis=-1)",
        "jump = _quiet(np.nanmax, np.where(near, np.abs(steps), np.nan), axis=-1)",
        [f"{DETECTORS}::test_a_loss_that_flattens_after_a_fall_into_the_window_is_no_level_shift"],
    ),
    Mutant(
        "issue 27: raw read: a history block counts NaN rows and other attempts' rows",
        "lossspike/sql/tick.py",
        '"loss_finite": f"COUNT({judged(\'loss_value\')})",\n        "loss_sum": f"SUM(',
        '"loss_finite": "COUNT(*)",\n        "loss_sum": f"SUM(',
        [f"{DETECTORS}::test_a_history_block_counts_only_the_judged_attempts_finite_losses"],
    ),
    Mutant(
        "issue 27: throughput_low and mfu_low fire at half the minutes below the floor",
        "lossspike/rules/checks.py",
        "if sum(m < floor for m in means) * 2 > len(means):",
        "if sum(m < floor for m in means) * 2 >= len(means):",
        [f"{CHECKS}::test_half_the_minutes_below_the_floor_is_not_most_of_them"],
    ),
    Mutant(
        "issue 27: labels: an episode ending on the first tick after start misses the label",
        "lossspike/backtest/labels.py",
        "return tick if tick <= span.last else None",
        "return tick if tick < span.last else None",
        ["tests/test_labels.py::test_an_episode_ending_on_the_first_tick_after_start_pages_the_label"],
    ),
    Mutant(
        "issue 27: labels: a page is false by its last tick, not its first",
        "lossspike/backtest/labels.py",
        "if not any(_covers(label, s.cluster, s.run, s.first) for label",
        "if not any(_covers(label, s.cluster, s.run, s.last) for label",
        ["tests/test_labels.py::test_a_page_is_false_by_where_it_starts_not_where_it_ends"],
    ),
    Mutant(
        "issue 27: backtest: newest-attempt ties go to the smaller UID",
        "lossspike/backtest/attempts.py",
        "((mine == best[owner]) & (seq[group] >= best_seq[owner]))",
        "((mine == best[owner]) & (seq[group] > best_seq[owner]))",
        ["tests/test_backtest.py::test_a_tie_between_attempts_goes_to_the_larger_uid_as_in_evaluate"],
    ),
    Mutant(
        "issue 27: backtest: the loss windows' attempt ties go to the smaller UID (the checks' stay right)",
        "lossspike/backtest/attempts.py",
        # An equal (or absent) seq no longer lets a later attempt win: a tie keeps the first (smaller).
        "(mine == best[owner]) & (seq[group] >= best_seq[owner])",
        "(mine == best[owner]) & (seq[group] > best_seq[owner])",
        ["tests/test_backtest.py::test_a_tie_between_attempts_goes_to_the_larger_uid_as_in_evaluate"],
    ),
    Mutant(
        "issue 27: backtest: a silenced page check counts in the episodes",
        "lossspike/backtest/result.py",
        "reasons = history.check_reasons(tick, severity, silenced=False)",
        "reasons = history.check_reasons(tick, severity, silenced=True)",
        ["tests/test_backtest.py::test_a_silenced_page_check_is_no_episode"],
    ),
    Mutant(
        "issue 27: backtest report: the episodes table shows the first reason only",
        "lossspike/backtest/report.py",
        '"+".join(e.reasons), format_rfc3339(e.first_tick)',
        "e.reason, format_rfc3339(e.first_tick)",
        ["tests/test_backtest.py::test_the_episodes_table_names_every_reason_an_episode_passed_through"],
    ),
    Mutant(
        "issue 27: cost: priced per TB, not per TiB",
        "lossspike/cost/fleet.py",
        "TIB = 2**40",
        "TIB = 10**12",
        ["tests/test_cost.py::test_dollars_are_bytes_in_tib_times_the_list_price"],
    ),
    Mutant(
        "issue 27: function: the schedule header's digits read in the process time zone",
        "lossspike/cloud/function.py",
        "        moment = parse_rfc3339(header)\n",
        "        moment = parse_rfc3339(header).replace(tzinfo=None).astimezone(parse_rfc3339(header).tzinfo)\n",
        ["tests/test_cloud.py::test_the_schedule_header_is_utc_whatever_the_process_time_zone"],
    ),
    Mutant(
        "issue 27: instability's reference window takes in the minute it judges",
        "lossspike/judge/detectors.py",
        "(means, REFERENCE_MINUTES, axis=-1)[..., :-1, :]\n"
        "    spreads = np.lib.stride_tricks.sliding_window_view(deviations, REFERENCE_MINUTES, axis=-1)[..., :-1, :]",
        "(means, REFERENCE_MINUTES, axis=-1)[..., 1:, :]\n"
        "    spreads = np.lib.stride_tricks.sliding_window_view(deviations, REFERENCE_MINUTES, axis=-1)[..., 1:, :]",
        [f"{DETECTORS}::test_default_settings_match_the_oracle"],
    ),
    Mutant(
        "issue 27: backtest checks: an evaluation is fresh for one minute, not thirty",
        "lossspike/backtest/check_replay.py",
        # The freshness is now EvalSeries.as_of's, shared with evaluate: the backtest's series
        # dates each evaluation 29 minutes early, so only one a minute old is fresh there.
        "start[rows].tolist(), values[rows].tolist(), eval_at[rows].tolist()",
        "start[rows].tolist(), values[rows].tolist(), (eval_at[rows] - 29 * minutes.MICROS_PER_MINUTE).tolist()",
        [BACKTEST_CHECKS],
    ),
    # --- seq: Finelog's write order settles a tie of the newest rows' instants (issue 23) ---
    Mutant(
        "seq: the tick forgets which of two same-instant rows was written last",
        "lossspike/judge/minutes.py",
        "    seq = choosing_seqs(hour_rows)\n",
        "    seq = np.zeros(len(run), dtype=np.int64)\n",
        ["tests/test_shapes.py::test_the_larger_seq_picks_the_attempt_when_newest_rows_share_an_instant"],
    ),
    Mutant(
        "seq: a bucket keeps the seq of any of its rows at its newest instant",
        "lossspike/sql/bucket.py",
        '    return f"CONCAT({padded(time)}, {ordered})"',
        "    return f\"CONCAT({padded(time)}, '')\"",
        ["tests/test_shapes.py::test_the_larger_seq_picks_the_attempt_when_newest_rows_share_an_instant"],
    ),
    # --- issue 46: the publisher's faults (tests/test_publish_faults.py) ---
    Mutant(
        "issue 46: publisher: refused rows counted as a list (a row named twice counts twice)",
        "lossspike/publish/publisher.py",
        "bad = {index for index in refused.rows if 0 <= index < len(part)}",
        "bad = [index for index in refused.rows if 0 <= index < len(part)]",
        [f"{FAULTS}::test_a_refusal_naming_some_rows_costs_exactly_those_rows"],
    ),
    Mutant(
        "issue 46: publisher: refused rows: a negative index counts",
        "lossspike/publish/publisher.py",
        "bad = {index for index in refused.rows if 0 <= index < len(part)}",
        "bad = {index for index in refused.rows if index < len(part)}",
        [f"{FAULTS}::test_a_refusal_naming_some_rows_costs_exactly_those_rows"],
    ),
    Mutant(
        "issue 46: publisher: a refusal of some rows counts the whole batch refused",
        "lossspike/publish/publisher.py",
        'self._settle(len(bad), "dropped_refused")',
        'self._settle(len(part), "dropped_refused")',
        [f"{FAULTS}::test_a_refusal_naming_some_rows_costs_exactly_those_rows"],
    ),
    Mutant(
        "issue 46: publisher: the rows a refusal did not name are not written",
        "lossspike/publish/publisher.py",
        "pending.append(rest)",
        "pass",
        [f"{FAULTS}::test_a_refusal_naming_some_rows_costs_exactly_those_rows"],
    ),
    Mutant(
        "issue 46: publisher: a BaseException in the flusher's own code ends it",
        "lossspike/publish/publisher.py",
        "                return\n            except BaseException as error:  # noqa: BLE001 - nothing may end",
        "                return\n            except Exception as error:  # noqa: BLE001 - nothing may end",
        [f"{FAULTS}::test_a_fault_in_the_flusher_itself_does_not_stop_it"],
    ),
    Mutant(
        "issue 46: publisher: rows in hand at a flusher fault go uncounted",
        "lossspike/publish/publisher.py",
        'self._settle(self._in_flight, "dropped_flusher_error")',
        "pass",
        [f"{FAULTS}::test_a_fault_in_the_flusher_itself_does_not_stop_it"],
    ),
    Mutant(
        "issue 46: publisher: the flusher restarts after a fault without waiting",
        "lossspike/publish/publisher.py",
        "self._stop.wait(self._flush_interval_s)",
        "return",
        [f"{FAULTS}::test_a_fault_in_the_flusher_itself_does_not_stop_it"],
    ),
    Mutant(
        "issue 46: publisher: each publisher gets an exit bound of its own",
        "lossspike/publish/publisher.py",
        "publisher._exit(deadline)",
        "publisher._exit(time.monotonic() + EXIT_FLUSH_SECONDS)",
        [f"{FAULTS}::test_two_publishers_with_hung_sinks_exit_within_one_bound"],
    ),
    # --- issue 46: the loader's identity, attempts and times (tests/test_load_history.py, test_load_hostile.py) ---
    Mutant(
        "issue 46: the loader: epoch milliseconds from 1e12 on",
        "lossspike/ingest/times.py",
        "EPOCH_MS_FROM = 1e11",
        "EPOCH_MS_FROM = 1e12",
        [f"{LOAD_HOSTILE}::test_the_seconds_milliseconds_boundary_and_microseconds"],
    ),
    Mutant(
        "issue 46: the loader: the boundary itself read as seconds",
        "lossspike/ingest/times.py",
        ">= EPOCH_MS_FROM",
        "> EPOCH_MS_FROM",
        [f"{LOAD_HOSTILE}::test_the_seconds_milliseconds_boundary_and_microseconds"],
    ),
    Mutant(
        "issue 46: the loader: a row's identity without its step",
        "lossspike/ingest/write.py",
        'step = " AND e.step IS NOT DISTINCT FROM r.step" if "step" in schema.names else ""',
        'step = ""',
        [f"{HISTORY}::test_a_longer_copy_adds_the_row_that_shares_a_second_with_the_last_loaded_one"],
    ),
    Mutant(
        "issue 46: the loader: a found file's own attempt wins over --attempt",
        "lossspike/ingest/sources.py",
        "found = [Source(s.path, s.kind, path.name if own else s.attempt) for s in found]",
        "found = [Source(s.path, s.kind, s.attempt or (path.name if own else None)) for s in found]",
        [f"{HISTORY}::test_attempt_names_its_directory_for_every_kind_of_source"],
    ),
    Mutant(
        "issue 46: the loader: a TensorBoard attempt is its leaf folder alone",
        "lossspike/ingest/sources.py",
        'return f"{parent.parent.name}/{parent.name}" if parent.parent.name else parent.name',
        "return parent.name",
        [f"{HISTORY}::test_two_jobs_whose_folders_share_a_name_are_two_attempts_loaded_in_either_order"],
    ),
    # --- issue 46: edges a planted bug passed unnoticed (tests/test_boundaries.py) ---
    Mutant(
        "issue 46: skip episodes: a minute skips only when its values sum to 1 or more",
        "lossspike/rules/checks.py",
        "            if total > 0 and not skipping:\n                starts += 1\n            skipping = total > 0",
        "            if total >= 1 and not skipping:\n                starts += 1\n            skipping = total >= 1",
        [f"{BOUNDARIES}::test_fractional_skipped_step_values_are_skipping_minutes"],
    ),
    Mutant(
        "issue 46: skip episodes: a window of non-finite values only is no metric",
        "lossspike/rules/checks.py",
        '    metric = data.metrics.get("skipped_steps")\n    if metric is None or metric.last is None:',
        '    metric = data.metrics.get("skipped_steps")\n    if metric is None or metric.last_finite is None:',
        [f"{BOUNDARIES}::test_a_window_holding_only_non_finite_skipped_step_values_pages"],
    ),
    Mutant(
        "issue 46: level_shift: a slope needs more than eight fit minutes",
        "lossspike/judge/detectors.py",
        "    sloped = count >= 2 * (MIN_HALF_MINUTES + 1)",
        "    sloped = count > 2 * (MIN_HALF_MINUTES + 1)",
        [f"{BOUNDARIES}::test_a_slope_comes_from_eight_fit_minutes_and_not_from_seven"],
    ),
    Mutant(
        "issue 46: level_shift: seven fit minutes give a slope",
        "lossspike/judge/detectors.py",
        "    sloped = count >= 2 * (MIN_HALF_MINUTES + 1)",
        "    sloped = count >= 2 * MIN_HALF_MINUTES + 1",
        [f"{BOUNDARIES}::test_a_slope_comes_from_eight_fit_minutes_and_not_from_seven"],
    ),
    Mutant(
        "issue 46: level_shift: a flat level needs more than three minutes",
        "lossspike/judge/detectors.py",
        "levels[1] = np.where(counts[1] >= MIN_HALF_MINUTES,",
        "levels[1] = np.where(counts[1] > MIN_HALF_MINUTES,",
        [f"{BOUNDARIES}::test_a_flat_level_comes_from_four_fit_minutes_and_not_from_three"],
    ),
    Mutant(
        "issue 46: level_shift: two minutes make a flat level",
        "lossspike/judge/detectors.py",
        "levels[1] = np.where(counts[1] >= MIN_HALF_MINUTES,",
        "levels[1] = np.where(counts[1] >= MIN_HALF_MINUTES - 1,",
        [f"{BOUNDARIES}::test_a_flat_level_comes_from_four_fit_minutes_and_not_from_three"],
    ),
    Mutant(
        "issue 46: resume_jump: the minute the new attempt began in counts as the old one's level",
        "lossspike/judge/detectors.py",
        "    before = (old.n > 0) & (idx < first[..., None])",
        "    before = (old.n > 0) & (idx <= first[..., None])",
        [f"{BOUNDARIES}::test_a_resume_in_the_minute_its_predecessor_ended_is_judged_against_the_minutes_before"],
    ),
    Mutant(
        "issue 46: resume_jump: the previous attempt's minutes after the new one began count",
        "lossspike/judge/detectors.py",
        "    before = (old.n > 0) & (idx < first[..., None])",
        "    before = (old.n > 0) & (idx < minutes)",
        [f"{BOUNDARIES}::test_attempts_that_overlap_are_judged_against_the_minutes_before_the_new_one"],
    ),
    Mutant(
        "issue 46: a NULL kind is no sample",
        "lossspike/sql/selection.py",
        "(kind IS NULL OR LOWER(kind) IN (",
        "(LOWER(kind) IN (",
        [
            f"{BOUNDARIES}::test_rows_with_a_null_kind_are_samples_on_duckdb",
            f"{BOUNDARIES}::test_rows_with_a_null_kind_are_samples_on_bigquery",
        ],
    ),
    # --- issue 45: instability's newest span ---
    Mutant(
        "issue 45: instability judges a train over the whole window only",
        "lossspike/judge/detectors.py",
        "    new = np.minimum(whole, newest) <= NEW_TRAIN_CHANCE / 2\n",
        "    new = whole <= NEW_TRAIN_CHANCE\n",
        [f"{DETECTORS}::test_a_spike_train_that_began_twenty_minutes_ago_pages_instability"],
    ),
    Mutant(
        "issue 45: a train's first episode counts as evidence",
        "lossspike/judge/detectors.py",
        "    after = np.where(idx > first[..., None], starts, False).sum(axis=-1)",
        "    after = np.where(idx >= first[..., None], starts, False).sum(axis=-1)",
        [f"{DETECTORS}::test_a_spike_train_that_began_twenty_minutes_ago_pages_instability"],
    ),
    # --- issue 45: seed 3119's false pages and must-not-page page ---
    Mutant(
        "issue 45: level_shift's trend runs over clock minutes, falling through a pause",
        "lossspike/judge/detectors.py",
        "    position = np.cumsum(data, axis=-1) - 1\n",
        "    position = np.broadcast_to(idx, data.shape)\n",
        [f"{DETECTORS}::test_a_fast_fall_paused_for_an_eval_is_no_level_shift_after_it"],
    ),
    Mutant(
        "issue 45: slow_divergence's level is the plain median of ten minutes",
        "lossspike/judge/detectors.py",
        "    current = low_median(tail)\n",
        "    current = median(tail)\n",
        [f"{DETECTORS}::test_a_four_minute_burst_in_a_slow_run_does_not_page_slow_divergence"],
    ),
    Mutant(
        "issue 45: a block an eval pause cut short is slow_divergence's best level",
        "lossspike/judge/detectors.py",
        "    enough = (counts >= MIN_BLOCK_SAMPLES) & _quiet(np.greater_equal, counts, MIN_BLOCK_SHARE * typical[..., None])",  # noqa: E501
        "    enough = counts >= MIN_BLOCK_SAMPLES",
        [f"{DETECTORS}::test_a_block_an_eval_pause_cut_short_is_no_best_level"],
    ),
    # --- issue 45: the checks' and instability's onsets ---
    Mutant(
        "issue 45: a loss_jump whose newest floor sits under the line names no onset",
        "lossspike/judge/onset.py",
        "        return jump_onset(run, levels[1] + float(threshold), t.min_rise)\n",
        "        return above_line(run, levels[1] + float(threshold), t.min_rise)\n",
        [f"{ONSET}::test_a_loss_jump_in_a_noisy_loss_names_where_it_jumped"],
    ),
    Mutant(
        "issue 45: steps_skipped names its newest episode, not its first",
        "lossspike/judge/onset.py",
        "            if metric.sums[k] > 0 and not skipping:\n                return metric.minutes[k]\n",
        "            if metric.sums[k] > 0 and not skipping:\n                start = metric.minutes[k]\n",
        [f"{ONSET}::test_a_skip_episode_page_names_its_first_episode_and_a_loss_before_it"],
    ),
    Mutant(
        "issue 45: a non-finite skip metric's onset is its newest minute",
        "lossspike/judge/onset.py",
        "        return condition_run_start([metric.minutes[k] for k in window], [_bad(metric.last[k]) for k in window])",  # noqa: E501
        "        return metric.minutes[window[-1]]",
        [f"{ONSET}::test_a_skip_episode_page_names_its_first_episode_and_a_loss_before_it"],
    ),
    Mutant(
        "issue 45: instability names the newest episode it counted",
        "lossspike/judge/onset.py",
        "    start = int(counted[0])\n",
        "    start = int(counted[-1])\n",
        [f"{ONSET}::test_an_instability_page_names_the_first_spike_of_its_train"],
    ),
    # --- issue 45: where a climb began ---
    Mutant(
        "issue 45: the onset is where the line was crossed, no climb followed back",
        "lossspike/judge/onset.py",
        "        start, level, scatter = climb_start(run.grid, data, start, rise)\n",
        "        level, scatter = None, 0.0\n",
        [f"{ONSET}::test_a_blowup_names_where_its_climb_began_not_where_it_crossed_the_line"],
    ),
    Mutant(
        "issue 45: a last good minute need only be under the median of the minutes before it",
        "lossspike/judge/onset.py",
        "    if level is not None:\n        out[slots] &=",
        "    if False:\n        out[slots] &=",
        [f"{ONSET}::test_a_blowup_names_where_its_climb_began_not_where_it_crossed_the_line"],
    ),
    Mutant(
        "issue 45: a climb's minutes need only clear min_rise, not the means' noise",
        "lossspike/judge/onset.py",
        "max(rise, CLIMB_SIGMAS * noise)",
        "rise",
        [f"{ONSET}::test_a_blowup_in_a_noisy_loss_is_not_followed_back_through_the_noise"],
    ),
    Mutant(
        "issue 45: slow_divergence calls a rise sudden without a flat level before it",
        "lossspike/judge/onset.py",
        "            if flat and len(risen) and risen[0] <= SUDDEN_MINUTES:",
        "            if len(risen) and risen[0] <= SUDDEN_MINUTES:",
        [f"{ONSET}::test_a_blowup_in_a_noisy_loss_is_not_followed_back_through_the_noise"],
    ),
    Mutant(
        "issue 45: slow_divergence calls any climb from a flat level sudden",
        "lossspike/judge/onset.py",
        "            if flat and len(risen) and risen[0] <= SUDDEN_MINUTES:",
        "            if flat and len(risen):",
        [f"{ONSET}::test_a_creep_from_a_flat_level_is_not_named_sudden"],
    ),
    Mutant(
        "issue 45: slow_divergence never names a step's onset",
        "lossspike/judge/onset.py",
        "    if min_rise is not None and rise is not None:\n",
        "    if False:\n",
        [f"{ONSET}::test_a_step_slow_divergence_sees_first_names_the_step"],
    ),
]


def copy_repo(target: Path) -> None:
    def ignore(directory: str, names: list[str]) -> set[str]:
        return {n for n in names if n in SKIP or n.endswith((".duckdb", ".png"))}

    shutil.copytree(REPO, target, ignore=ignore, symlinks=True)
    tools = REPO / ".tools"
    if tools.exists():
        (target / ".tools").symlink_to(tools.resolve())


def run_tests(copy: Path, tests: list[str], timeout: float = TIMEOUT_SECONDS) -> tuple[int, float, str]:
    shutil.rmtree(copy / ".hypothesis", ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(copy)}
    env = {k: v for k, v in env.items() if not k.startswith("LOSSSPIKE_")}
    python = REPO / ".venv" / "bin" / "python"
    command = [str(python), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    command += [f"--hypothesis-seed={HYPOTHESIS_SEED}", *tests]
    started = time.monotonic()
    done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines() or [""]
    # The test that failed first (pytest's short summary), to say which test killed the mutant.
    failed = [line.split(" - ")[0].removeprefix("FAILED ") for line in lines if line.startswith("FAILED ")]
    summary = lines[-1] + (f"; by {failed[0]}" if failed else "")
    return done.returncode, time.monotonic() - started, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", action="append", help="run the mutants whose name contains this text (repeat for more)"
    )
    parser.add_argument("--skip", action="append", default=[], help="leave out the mutants whose name contains this")
    parser.add_argument("--keep", action="store_true", help="keep the copy and print its path")
    args = parser.parse_args()
    mutants = [m for m in MUTANTS if not args.only or any(text in m.name for text in args.only)]
    mutants = [m for m in mutants if not any(text in m.name for text in args.skip)]

    work = Path(tempfile.mkdtemp(prefix="lossspike-mutants-"))
    copy = work / "repo"
    copy_repo(copy)
    try:
        # The copy must be importable and the tests must pass before any bug is planted.
        tests = sorted({t for m in mutants for t in m.tests})
        code, seconds, summary = run_tests(copy, tests, BASELINE_TIMEOUT_SECONDS)
        print(f"unmutated: {'PASS' if code == 0 else 'FAIL'} in {seconds:.0f} s ({summary})", flush=True)
        if code != 0:
            return 2
        print(
            "not a product bug, not planted: a looser oracle (its tolerance is a parameter of tests/oracle.py)",
            flush=True,
        )
        killed = 0
        for mutant in mutants:
            target = copy / mutant.path
            original = target.read_text()
            if original.count(mutant.old) != 1:
                print(f"CANNOT APPLY  {mutant.name}: the text to replace is not in {mutant.path} exactly once")
                return 2
            target.write_text(original.replace(mutant.old, mutant.new))
            try:
                code, seconds, summary = run_tests(copy, mutant.tests)
            finally:
                target.write_text(original)
            # pytest exits 1 when a test failed; 2-4 mean the run itself broke (an import error).
            verdict = "KILLED" if code == 1 else "SURVIVED" if code == 0 else f"ERROR({code})"
            killed += verdict == "KILLED"
            print(f"{verdict:<9} {mutant.name}  [{seconds:.0f} s: {summary}]", flush=True)
        print(f"total: {killed} of {len(mutants)} mutants killed, {len(mutants) - killed} not killed")
        return 0 if killed == len(mutants) else 1
    finally:
        if args.keep:
            print(f"copy kept at {copy}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
