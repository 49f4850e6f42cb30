"""
Text <-> token ids for every kind of dataset, from its meta.json: "char", "gpt2" (tiktoken's)
and "bpe" (a tokenizer.json such as Pythia's, bpe.py).

    tok = Tokenizer.load("data/shakespeare_char")   # the tokenizer a dataset was made with
    ids = tok.encode("ROMEO:")                       # -> [30, 27, 25, 17, 27, 10]
"""
import json
import os

import numpy as np

from data.meta import DataError, read_meta


class Tokenizer:
    """Character-level, or a subword vocabulary of bpe.py; to_meta() is its part of meta.json."""

    def __init__(self, kind, chars=None, encoding="gpt2", path=None):
        self.kind = kind
        if kind in ("gpt2", "bpe"):
            from data.bpe import GPT2, ByteLevelBPE
            self._bpe = GPT2(encoding) if kind == "gpt2" else ByteLevelBPE(path)
            self.vocab_size, self.path = self._bpe.vocab_size, getattr(self._bpe, "file", None)
        elif kind == "char":
            self.chars = list(chars)
            if len(set(self.chars)) != len(self.chars) or any(len(c) != 1 for c in self.chars):
                raise DataError("char vocabulary must be distinct single characters")
            # ids are positions in self.chars; a sorted copy of the code points lets numpy
            # map a whole chunk at once with searchsorted, whatever order chars came in
            cps = np.array([ord(c) for c in self.chars], dtype=np.uint32)
            self._order = np.argsort(cps)
            self._sorted = cps[self._order]
            self.vocab_size = len(self.chars)
        else:
            raise DataError(f"unknown tokenizer {kind!r}; use 'char', 'gpt2' or the path of a "
                            f"tokenizer.json (or of a Hugging Face model folder holding one)")

    @classmethod
    def from_meta(cls, meta, folder=None):
        """folder: the dataset folder, where a byte-level BPE's tokenizer.json is kept."""
        if meta["tokenizer"] == "char":
            return cls("char", chars=meta["chars"])
        if meta["tokenizer"] == "bpe":
            file = meta.get("tokenizer_file", "tokenizer.json")
            tok = cls("bpe", path=os.path.join(folder or ".", file))
            if tok.identity != meta.get("tokenizer_sha256", tok.identity):
                raise DataError(f"{tok.path} is not the tokenizer this dataset was made with (its "
                                f"sha256 differs from meta.json's); prepare the dataset again")
            return tok
        return cls(meta["tokenizer"], encoding=meta.get("encoding", "gpt2"))

    @classmethod
    def load(cls, path):
        """path: a dataset folder or its meta.json."""
        if os.path.isdir(path):
            path = os.path.join(path, "meta.json")
        return cls.from_meta(read_meta(path), os.path.dirname(path))

    def to_meta(self):
        if self.kind == "char":
            return {"tokenizer": "char", "chars": "".join(self.chars),
                    "vocab_size": self.vocab_size}
        return {**self._bpe.to_meta(), "vocab_size": self.vocab_size}

    @property
    def identity(self):
        """Equal for tokenizers that give the same ids: a subword vocabulary's fingerprint."""
        if self.kind != "char":
            return self._bpe.fingerprint
        return json.dumps(self.to_meta(), sort_keys=True)

    @property
    def eot_id(self):
        """The end-of-text token's id, or None (character vocabularies have none)."""
        return None if self.kind == "char" else self._bpe.eot_id

    @property
    def default_prompt(self):
        """A new line, where the training text has one; else the empty prompt (token 0)."""
        return "\n" if self.kind != "char" or "\n" in self.chars else ""

    def encode_array(self, text):
        if self.kind != "char":
            return np.array(self._bpe.encode(text), dtype=np.int64)
        cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
        pos = np.minimum(np.searchsorted(self._sorted, cps), len(self._sorted) - 1)
        unknown = self._sorted[pos] != cps
        if unknown.any():
            bad = sorted({chr(c) for c in cps[unknown]})
            more = f", ... ({len(bad)} in all)" if len(bad) > 10 else ""
            raise DataError("characters not in the vocabulary: " + ", ".join(map(repr, bad[:10]))
                            + more + f"; this character-level model knows only the "
                            f"{self.vocab_size} characters of its training text: leave them out")
        return self._order[pos]

    def encode(self, text):
        return self.encode_array(text).tolist()

    def decode(self, ids):
        if self.kind != "char":
            return self._bpe.decode(ids)
        return "".join(self.chars[int(i)] for i in ids if 0 <= int(i) < self.vocab_size)
