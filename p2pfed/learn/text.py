"""Text for next-token prediction: words of several languages (or any groups of text files) as character
sequences, each sample tagged with its group, so that a partition can give each node the words of one
language (the motivating experiment of Rokvic et al. 2025: Norwegian, Swedish and Danish; here from the word
lists Debian ships offline, as no corpus or hub download is possible).

A word becomes a sample: x = BOS c1 … cn, y = c1 … cn EOS, both padded to the longest word allowed (y's
padding is tasks.PAD, left out of loss and metrics). Characters are lowercased; the vocabulary is every
character of every group, sorted, so every node derives the same one.

Word sequences (``words_per_sample`` n > 1, data.words_per_sample): a sample is n consecutive words joined
by spaces, so the model also learns how words follow each other and where one ends, as a model of running
text does. In running text the words keep the text's order. A word list (one word per line, as Debian's)
has no order to keep: its distinct words are shuffled with the seed first, so a sequence is n words of the
language drawn at random rather than n alphabetical neighbours that share a prefix.

The word lists come in mixed encodings (Debian's bokmål, nynorsk and Swedish lists are ISO-8859-1, the
Danish one UTF-8). A file is read as UTF-8 when it is valid UTF-8, else as ISO-8859-1: ISO-8859-1 text with
any letter beyond ASCII (æ, ø, å, ä, ö) is never valid UTF-8, and a wrong guess would drop or garble exactly
the letters that tell the languages apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from p2pfed.learn.tasks import PAD

DICT = Path("/usr/share/dict")
# Debian's word lists (packages wnorwegian, wswedish, wdanish): the languages of the scandinavian dataset.
SCANDINAVIAN = {"bokmaal": DICT / "bokmaal", "nynorsk": DICT / "nynorsk", "swedish": DICT / "swedish",
                "danish": DICT / "danish"}
BOS, EOS = "\x02", "\x03"  # the start and end tokens, characters no word holds
MAX_FILE_BYTES = 64 << 20  # a word list of 64 MB is far beyond any language's; larger is a wrong path


@dataclass
class Words:
    """Words per group, encoded: x and y (N, max_len + 1) int64, groups (N,), the vocabulary in order."""

    x: torch.Tensor
    y: torch.Tensor
    groups: np.ndarray
    vocabulary: str
    group_names: list[str]


def read_text(path: Path) -> str:
    """A text file's contents, UTF-8 when it is valid UTF-8, else ISO-8859-1 (see the module's docstring)."""
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ValueError(f"{path}: {size >> 20} MB is more text than a word list holds (at most "
                         f"{MAX_FILE_BYTES >> 20} MB)")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("iso-8859-1")


def words_of(text: str, max_len: int) -> list[str]:
    """The distinct lowercased words of a text (whitespace-separated; a word list has one per line), in order
    of first appearance, without those longer than max_len or holding a control character."""
    seen: dict[str, None] = {}
    for word in text.lower().split():
        if len(word) <= max_len and word.isprintable() and word not in seen:
            seen[word] = None
    return list(seen)


def is_word_list(text: str) -> bool:
    """Whether a text is a word list (nearly every non-empty line one word: a stray line of two does not make
    it prose) rather than running text."""
    lines = [line for line in text.splitlines() if line.strip()]
    return sum(len(line.split()) == 1 for line in lines) >= 0.9 * len(lines)


SHUFFLE = 104_729  # the tag of a word list's shuffle in its seed, apart from the draws of load_words


def sequences_of(text: str, words_per_sample: int, max_len: int, seed: int) -> list[str]:
    """The text as samples of words_per_sample consecutive words joined by spaces, not overlapping, each distinct
    sequence once (as a word is once with 1: words_of), so that no sample is both trained and tested on; a word
    list's words are shuffled with seed first (see the module's docstring). A word longer than max_len or holding
    a control character is left out (its neighbours then follow each other)."""
    if words_per_sample <= 1:
        return words_of(text, max_len)
    if is_word_list(text):
        distinct = words_of(text, max_len)
        words = [distinct[i] for i in np.random.default_rng([seed, SHUFFLE]).permutation(len(distinct))]
    else:
        words = [w for w in text.lower().split() if len(w) <= max_len and w.isprintable()]
    sequences = (" ".join(words[i:i + words_per_sample])
                 for i in range(0, len(words) - words_per_sample + 1, words_per_sample))
    return list(dict.fromkeys(sequences))


def sample_length(words_per_sample: int, max_len: int) -> int:
    """The longest sample in characters: n words of at most max_len letters and the n - 1 spaces between."""
    return words_per_sample * (max_len + 1) - 1


def load_words(files: dict[str, Path], per_group: int, max_len: int, seed: int, words_per_sample: int = 1) -> Words:
    """per_group samples (words, or sequences of words_per_sample words) drawn from each group's file
    (deterministically from seed), encoded."""
    chosen: dict[str, list[str]] = {}
    what = "words" if words_per_sample <= 1 else f"sequences of {words_per_sample} words"
    for name, path in files.items():
        words = sequences_of(read_text(path), words_per_sample, max_len, seed)
        if len(words) < 4:  # a quarter of a group's words are its test words: at least one
            raise ValueError(f"{path}: {len(words)} usable {what} (need at least 4, of words of at most {max_len} "
                             "letters)")
        rng = np.random.default_rng([seed, len(chosen)])
        picks = rng.choice(len(words), size=min(per_group, len(words)), replace=False)
        chosen[name] = [words[i] for i in np.sort(picks)]
    vocabulary = vocabulary_of("".join(w for ws in chosen.values() for w in ws))
    x, y = encode_words([w for ws in chosen.values() for w in ws], vocabulary,
                        sample_length(words_per_sample, max_len))
    groups = [g for g, words in enumerate(chosen.values()) for _ in words]
    return Words(x, y, np.array(groups, dtype=np.int64), vocabulary, list(chosen))


def vocabulary_of(letters: str) -> str:
    """The vocabulary of text made of these letters: start and end tokens, then the letters sorted (the same
    on every node that is given the same letters)."""
    return BOS + EOS + "".join(sorted(set(letters) - {BOS, EOS}))


def encode_words(words: list[str], vocabulary: str, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Words (each of vocabulary's letters, at most max_len) as samples x and y (N, max_len + 1)."""
    index = {c: i for i, c in enumerate(vocabulary)}
    width = max_len + 1
    xs, ys = [], []
    for w in words:
        tokens = [index[BOS], *(index[c] for c in w), index[EOS]]
        xs.append(tokens[:-1] + [index[EOS]] * (width - len(tokens) + 1))  # inputs past the end: never scored
        ys.append(tokens[1:] + [PAD] * (width - len(tokens) + 1))
    return (torch.tensor(xs, dtype=torch.int64).reshape(-1, width),
            torch.tensor(ys, dtype=torch.int64).reshape(-1, width))


def decode(tokens: torch.Tensor, vocabulary: str) -> str:
    """The characters of a token sequence, up to its end token (for reading samples and predictions)."""
    out = []
    for t in tokens.tolist():
        if not 0 <= t < len(vocabulary) or vocabulary[t] == EOS:
            break
        if vocabulary[t] != BOS:
            out.append(vocabulary[t])
    return "".join(out)
