"""Finding a load's sources: the files a path names (a directory is searched), each with its format and attempt."""

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


def find_sources(paths: Sequence[str], attempt_paths: Sequence[str] = ()) -> list[Source]:
    """The files `paths` name (a directory is searched), each with its format; LoadError for none."""
    sources: list[Source] = []
    for text, own in [(p, False) for p in paths] + [(p, True) for p in attempt_paths]:
        path = Path(text)
        if not path.exists():
            raise LoadError(f"{path}: no such file or directory")
        if path.is_dir():
            found = _search(path)
            if not found:
                raise LoadError(
                    f"{path}: no W&B run (run-*.wandb), TensorBoard event file (events.out.tfevents.*) or"
                    " CSV/JSON lines/Parquet file in it"
                )
            sources += [Source(s.path, s.kind, s.attempt or (path.name if own else None)) for s in found]
            continue
        kind = _kind(path)
        if kind is None:
            raise LoadError(
                f"{path}: unknown format; give a .csv, .jsonl, .parquet, events.out.tfevents.* or run-*.wandb file"
            )
        attempt = _attempt_name(path) if own or kind in ("tensorboard", "wandb") else None
        sources.append(Source(path, kind, attempt))
    return sources


def _kind(path: Path) -> str | None:
    if TENSORBOARD_MARK in path.name:
        return "tensorboard"
    if path.suffix == WANDB_SUFFIX:
        return "wandb"
    return TABLE_FORMATS.get(path.suffix.lower())


def _search(directory: Path) -> list[Source]:
    """A directory's sources: W&B runs, else TensorBoard runs (one attempt per directory), else tables."""
    # wandb/latest-run is a symbolic link to the newest run directory: the same file again.
    wandb = sorted(p for p in directory.rglob(f"run-*{WANDB_SUFFIX}") if not p.parent.is_symlink())
    if wandb:
        return [Source(p, "wandb", _attempt_name(p)) for p in wandb]
    events = sorted(p for p in directory.rglob(f"*{TENSORBOARD_MARK}*") if p.is_file())
    if events:
        return [Source(p, "tensorboard", _attempt_name(p)) for p in events]
    tables = sorted(p for p in directory.rglob("*") if p.is_file() and _kind(p) in TABLE_FORMATS.values())
    return [Source(p, _kind(p) or "csv") for p in tables]


def _attempt_name(path: Path) -> str:
    """The execution_uid a file or run directory gives its rows.

    A W&B job writes `run-<date>_<time>-<id>/run-<id>.wandb`, a resumed job a new directory
    with the same id, so the directory (less `run-`) names the job; TensorBoard's run is the
    directory holding the event files; a table is its file name without the suffix.
    """
    if path.suffix == WANDB_SUFFIX or TENSORBOARD_MARK in path.name:
        parent = path.parent.name
        return parent.removeprefix("run-").removeprefix("offline-run-") or path.stem
    return path.stem
