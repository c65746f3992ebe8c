"""Finding a load's sources: the files a path names (a directory is searched), each with its format and attempt.

An attempt (execution_uid) is one job of the run, named the same whatever path names it:

- a W&B run directory, `run-<date>_<time>-<id>` (or `offline-run-...`), less its prefix: the
  date and time make each job's directory unique, and a resumed job writes a new one;
- a TensorBoard run directory (the one holding its event files), as `<parent>/<directory>`:
  jobs often write `job-1/tensorboard` and `job-2/tensorboard`, whose last folder alone would
  merge two jobs into one attempt, and the name must not depend on which other jobs one load
  is given (a load of job-2 and a later load of job-1 name each job as a load of both does);
- what `--attempt` names: its file's name less the suffix, or its directory's name, for every
  source under it.

Paths are resolved first, so a symbolic link (W&B's `wandb/latest-run`) is the run it points at,
and a file named twice (a directory and its `latest-run` link) is read once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lossspike.ingest.base import LoadError, Source

# A table file's format by its suffix (a directory's tables are the files with one of these).
TABLE_FORMATS = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}
# TensorBoard names its event files events.out.tfevents.*; W&B its run files run-<id>.wandb.
TENSORBOARD_MARK = "tfevents"
WANDB_SUFFIX = ".wandb"
# W&B's run directories: `{run_mode}-{timespec}-{run_id}`, run_mode "run" online and "offline-run"
# offline, holding `run-{run_id}.wandb`, with `latest-run` a link to the newest (wandb 0.29,
# wandb/sdk/wandb_settings.py: sync_dir, sync_file, sync_symlink_latest). The prefix is no part
# of the job's name; the file's name gives the run ID.
WANDB_DIR_PREFIXES = ("offline-run-", "run-")


def find_sources(
    paths: Sequence[str], attempt_paths: Sequence[str] = (), notes: list[str] | None = None
) -> list[Source]:
    """The files `paths` name (a directory is searched), each with its format; LoadError for none.

    `notes` gets a line for each directory that holds several TensorBoard runs (they load as
    attempts of the one run: the user hears which, and how to load them apart).
    """
    sources: list[Source] = []
    seen: set[Path] = set()
    for text, own in [(p, False) for p in paths] + [(p, True) for p in attempt_paths]:
        given = Path(text)
        if not given.exists():
            raise LoadError(f"{given}: no such file or directory")
        path = given.resolve()
        if path.is_dir():
            found = _search(path)
            if not found:
                raise LoadError(
                    f"{given}: no W&B run (run-*.wandb), TensorBoard event file (events.out.tfevents.*) or"
                    " CSV/JSON lines/Parquet file in it"
                )
            found = [Source(s.path, s.kind, path.name if own else s.attempt) for s in found]
            runs = sorted({s.attempt for s in found if s.kind == "tensorboard" and s.attempt})
            if notes is not None and not own and len(runs) > 1:
                notes.append(
                    f"{given}: {len(runs)} TensorBoard run directories, loaded as {len(runs)} attempts of this run"
                    f" ({', '.join(runs)}); if they are separate experiments, load each directory with its own --run"
                )
        else:
            # The name the user gave says the format: a link such as `zero.csv -> /dev/zero` is read as CSV.
            kind = _kind(given) or _kind(path)
            if kind is None:
                raise LoadError(
                    f"{given}: unknown format; give a .csv, .jsonl, .parquet, events.out.tfevents.* or run-*.wandb file"
                )
            attempt = path.stem if own else _attempt_name(path) if kind in ("tensorboard", "wandb") else None
            # Read, and named in every message, by the path the user gave; its attempt is the resolved one's.
            found = [Source(given, kind, attempt)]
        for source in found:
            if source.path.resolve() not in seen:
                seen.add(source.path.resolve())
                sources.append(source)
    _one_wandb_run(sources)
    return sources


def _one_wandb_run(sources: Sequence[Source]) -> None:
    """Refuse W&B files of several run IDs: one load is one run, and a resume keeps its run's ID."""
    ids: dict[str, Path] = {}
    for source in sources:
        if source.kind == "wandb":
            ids.setdefault(source.path.stem.removeprefix("run-"), source.path.parent)
    if len(ids) > 1:
        named = ", ".join(f"{run_id} ({where})" for run_id, where in sorted(ids.items()))
        raise LoadError(
            f"the sources hold {len(ids)} W&B runs: {named}; a load is one run: load each with its own --run"
        )


def _kind(path: Path) -> str | None:
    if TENSORBOARD_MARK in path.name:
        return "tensorboard"
    if path.suffix == WANDB_SUFFIX:
        return "wandb"
    return TABLE_FORMATS.get(path.suffix.lower())


def _search(directory: Path) -> list[Source]:
    """A directory's sources: W&B runs, else TensorBoard runs (one attempt per directory), else tables."""
    # Each file once, by its resolved path: wandb/latest-run links to a run directory also found by name.
    wandb = sorted({p.resolve() for p in directory.rglob(f"run-*{WANDB_SUFFIX}") if p.is_file()})
    if wandb:
        return [Source(p, "wandb", _attempt_name(p)) for p in wandb]
    events = sorted({p.resolve() for p in directory.rglob(f"*{TENSORBOARD_MARK}*") if p.is_file()})
    if events:
        return [Source(p, "tensorboard", _attempt_name(p)) for p in events]
    tables = sorted({p.resolve() for p in directory.rglob("*") if p.is_file() and _kind(p) in TABLE_FORMATS.values()})
    return [Source(p, _kind(p) or "csv") for p in tables]


def _attempt_name(path: Path) -> str:
    """The execution_uid a W&B or TensorBoard file (a resolved path) gives its rows: its run directory's name."""
    parent = path.parent
    if path.suffix == WANDB_SUFFIX:
        for prefix in WANDB_DIR_PREFIXES:
            if parent.name.startswith(prefix) and parent.name != prefix:
                return parent.name.removeprefix(prefix)
        return parent.name or path.stem
    return f"{parent.parent.name}/{parent.name}" if parent.parent.name else parent.name
