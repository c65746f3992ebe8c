"""A tiny real Levanter training run on CPU, offline (run in .tools/levanter, marin-levanter 0.2.20).

Usage: python tests/levanter_run.py CONFIG.yaml [--draccus.override value ...]

CONFIG.yaml is a Levanter `TrainLmConfig` (levanter/main/train_lm.py), parsed
by draccus with the overrides after it as Levanter's entry points parse theirs
(levanter/config.py `main`). Its `trainer.tracker` list names the lossspike
tracker. Training is `levanter.main.train_lm.main` itself: Levanter's Trainer,
data loader and callbacks (levanter/trainer.py `Trainer.train_step`,
levanter/callbacks/_metrics.py `log_step_info` and `log_performance_stats`,
levanter/callbacks/watch.py) log every metric the tracker receives; this
script logs none.

No network: before training, this script writes what the config points at and
Levanter would otherwise fetch, both synthetic:
- a word-level tokenizer saved as a Hugging Face tokenizer directory at
  `data.tokenizer`. levanter/tokenizers.py `load_tokenizer` reads a local
  directory as is, and the model's converter
  (levanter/compat/hf_checkpoints.py `_infer_tokenizer`) loads the same
  directory through transformers' AutoTokenizer, which needs
  `tokenizer_class` in tokenizer_config.json for a directory without a model
  config.
- a jsonl corpus (`{"text": ...}` lines, Levanter's default text format) at
  each component's `source.train_urls`
  (levanter/data/text/datasets.py `UrlDatasetSourceConfig`). Levanter
  tokenizes it into its own cache under `data.cache_dir`.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import draccus
from levanter.main.train_lm import TrainLmConfig
from levanter.main.train_lm import main as train_lm
from tokenizers import Tokenizer, models, pre_tokenizers

import lossspike.levanter_tracker  # noqa: F401 - registers tracker type "lossspike"

# Small enough to learn in a few dozen steps, large enough that the loss starts well above zero.
WORDS = [f"w{i}" for i in range(60)]
SPECIAL = {"bos": "<s>", "eos": "</s>", "unk": "<unk>"}
# Each document walks the word list from a random start: the next word is learnable, so the loss falls.
DOCUMENTS, WORDS_PER_DOCUMENT = 400, 40


def write_tokenizer(directory: Path) -> None:
    """A WordLevel tokenizer over WORDS as a Hugging Face tokenizer directory."""
    vocab = {token: i for i, token in enumerate([*SPECIAL.values(), *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL["unk"]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast"} | {f"{k}_token": v for k, v in SPECIAL.items()}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def write_corpus(path: Path, seed: int = 0) -> None:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for _ in range(DOCUMENTS):
            start = rng.randrange(len(WORDS))
            text = " ".join(WORDS[(start + k) % len(WORDS)] for k in range(WORDS_PER_DOCUMENT))
            out.write(json.dumps({"text": text}) + "\n")


def main(config_path: str, overrides: list[str]) -> None:
    config = draccus.parse(config_class=TrainLmConfig, config_path=config_path, args=overrides)
    tokenizer_dir = Path(config.data.tokenizer)
    if not (tokenizer_dir / "tokenizer.json").exists():
        write_tokenizer(tokenizer_dir)
    for component in config.data.components.values():
        for url in component.source.train_urls:
            if not Path(url).exists():
                write_corpus(Path(url))
    train_lm(config)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
