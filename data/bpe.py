"""
Byte-level BPE tokenizers from a Hugging Face tokenizer.json (GPT-NeoX / Pythia's, GPT-2's, ...),
run by tiktoken: the same ids as the `tokenizers` package, without it.

    tok = ByteLevelBPE("pythia-160m")        # a folder holding tokenizer.json, or the file itself
    tok.encode("Hello  world<|endoftext|>")  # -> [12092, 50276, 10186, 0]

Onto tiktoken: every token's rank is the position of the merge that makes it (the 256 bytes
first), one table maps ranks to the file's ids; added tokens are split off first. A file of another
shape runs through the `tokenizers` package where installed, else is refused by name.
"""
import hashlib
import json
import os
import re
import unicodedata

import numpy as np

from configurator import DataError
from support import files

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
NOT_UTF8 = {0xC0, 0xC1, *range(0xF5, 256)}  # bytes no text holds


def bytes_to_unicode():
    """GPT-2's byte -> character table: printable Latin-1 bytes as is, the other 68 from U+0100."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    others = iter(range(256, 512))
    return {b: chr(b if b in keep else next(others)) for b in range(256)}


def read_tokenizer_json(path):
    """(the file, its JSON) of a tokenizer.json, or of the one in a Hugging Face model folder."""
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    try:
        spec = files.read_json(file)
        if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
            raise ValueError("no 'model'")
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read the tokenizer {file} ({type(e).__name__}: {e}); give a "
                        f"Hugging Face tokenizer.json or a model folder holding one") from None
    return file, spec


MAX_ID = 1 << 24  # GPT-NeoX's: 50,277


def check(spec, file):
    """What decides the ids, checked before anything is built from it (DataError: the field)."""
    bad = f"{file} is not a tokenizer nanoMeSH can run:"
    model = spec["model"]
    if model.get("type") != "BPE":
        raise DataError(f"{bad} model.type is {model.get('type')!r:.40}, "
                        f"not 'BPE' (byte-level BPE tokenizers such as GPT-NeoX's only)")
    vocab, by_id = model.get("vocab"), {}
    if not isinstance(vocab, dict):
        raise DataError(f"{bad} model.vocab is not a mapping of tokens to ids")
    for token, i in vocab.items():
        if type(i) is not int or not 0 <= i < MAX_ID:  # a bool is no id
            raise DataError(f"{bad} model.vocab gives {token!r:.40} the id {i!r:.40}, "
                            f"not an integer from 0 to {MAX_ID - 1:,}")
        if i in by_id:
            raise DataError(f"{bad} model.vocab gives {by_id[i]!r:.40} and {token!r:.40} "
                            f"the same id {i}")
        by_id[i] = token
    for merge in model.get("merges") or []:
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if (not isinstance(pair, list) or len(pair) != 2
                or not all(isinstance(t, str) and t for t in pair)):
            raise DataError(f"{bad} model.merges holds {merge!r:.60}, not a pair of tokens")
        unknown = next((t for t in (*pair, "".join(pair)) if t not in vocab), None)
        if unknown is not None:
            raise DataError(f"{bad} the merge {merge!r:.60} uses or makes {unknown!r:.40}, "
                            f"which model.vocab lacks")
    for key in ("normalizer", "pre_tokenizer", "decoder"):
        if not isinstance(spec.get(key) or {}, dict):
            raise DataError(f"{bad} {key} is {spec[key]!r:.40}, not an object")
    added, free = {}, len(vocab)  # the ids tokenizers gives
    for t in spec.get("added_tokens") or []:
        content, i = (t.get("content"), t.get("id")) if isinstance(t, dict) else (None, None)
        if not isinstance(content, str) or type(i) is not int or not 0 <= i < MAX_ID:
            raise DataError(f"{bad} added_tokens holds {t!r:.60}, not a content string "
                            f"with an id from 0 to {MAX_ID - 1:,}")
        if not content:
            continue  # tokenizers gives it no id
        want = added.setdefault(content, vocab.get(content, free))
        free = max(free, want + 1)
        if want != i:
            raise DataError(f"{bad} the added token {content!r:.40} has id {i}, "
                            f"but tokenizers gives it {want} (a vocabulary token's "
                            f"id, else the next free one, in the file's order); "
                            f"give it id {want}")
        if by_id.setdefault(i, content) != content:
            raise DataError(f"{bad} the added token {content!r:.40} has id {i}, "
                            f"which is {by_id[i]!r:.40}'s")


def _why_not_tiktoken(spec):
    """The reason tiktoken cannot reproduce this tokenizer exactly, or None."""
    model, pre, norm = spec["model"], spec.get("pre_tokenizer"), spec.get("normalizer")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "ignore_merges",
                "byte_fallback"):
        if model.get(key):
            return f"BPE {key}={model[key]!r}"
    if (not pre or pre.get("type") != "ByteLevel" or pre.get("add_prefix_space")
            or not pre.get("use_regex", True)):
        return f"pre-tokenizer {pre!r} is not ByteLevel without add_prefix_space"
    if norm and norm.get("type") != "NFC":
        return f"normalizer {norm.get('type')!r} (only none or NFC)"
    if (spec.get("decoder") or {}).get("type", "ByteLevel") != "ByteLevel":
        return f"decoder {spec['decoder'].get('type')!r} is not ByteLevel"
    for t in spec.get("added_tokens") or []:
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            return f"added token {t['content']!r} has lstrip, rstrip or single_word"
        if (norm and t.get("normalized", not t.get("special"))
                and unicodedata.normalize("NFC", t["content"]) != t["content"]):
            return f"normalized added token {t['content']!r} is not in NFC"
    return None


class ByteLevelBPE:
    """encode(text) -> list of ids and decode(ids) -> text of a byte-level BPE tokenizer.json."""

    def __init__(self, path):
        self.file, spec = read_tokenizer_json(path)
        check(spec, self.file)
        keys = ("model", "added_tokens", "normalizer", "pre_tokenizer", "decoder")  # decide ids
        decides = json.dumps({k: spec.get(k) for k in keys}, sort_keys=True)
        self.fingerprint = hashlib.sha256(decides.encode()).hexdigest()
        # one of no text matches nowhere, as in tokenizers
        added = [t for t in spec.get("added_tokens") or [] if t["content"]]
        self.added = {t["content"]: t["id"] for t in added}
        vocab = spec["model"]["vocab"]
        self.vocab_size = max([*vocab.values(), *self.added.values()], default=-1) + 1
        self.eot_id = self.added.get("<|endoftext|>", vocab.get("<|endoftext|>"))
        self._hf = None
        why = _why_not_tiktoken(spec) or self._build_tiktoken(spec, vocab, added)
        if why is not None:
            try:
                from tokenizers import Tokenizer as HFTokenizer
            except ImportError:
                raise DataError(f"{self.file} cannot be run exactly by tiktoken ({why}); "
                                f"pip install tokenizers to use it") from None
            try:
                self._hf = HFTokenizer.from_file(self.file)
                self._hf.no_truncation()  # the file's, if any: every id
                self._hf.no_padding()
            except Exception as e:  # the tokenizers package's own refusal: one line too
                raise DataError(f"{self.file} cannot be run by tiktoken ({why}) "
                                f"nor by the tokenizers package ({type(e).__name__}: "
                                f"{str(e).splitlines()[0][:120] if str(e) else ''})") from None
        self.backend = "tokenizers" if self._hf else "tiktoken"

    def to_meta(self):  # the file itself is copied next to meta.json
        return {"tokenizer": "bpe", "tokenizer_file": "tokenizer.json",
                "tokenizer_sha256": self.fingerprint}

    def _build_tiktoken(self, spec, vocab, added):
        import tiktoken
        byte_of = {c: b for b, c in bytes_to_unicode().items()}

        def to_bytes(token):
            return bytes(byte_of[c] for c in token)

        # added tokens (which the vocabulary may also list, as they are spelled) decode as content
        vocab_bytes = {t: i for t, i in vocab.items() if t not in self.added}
        if any(c not in byte_of for token in vocab_bytes for c in token):
            return "a vocabulary entry is not spelled in GPT-2's byte alphabet"
        ranks, to_id = {}, []
        for c, b in byte_of.items():
            if c in vocab_bytes:
                ranks[bytes([b])] = b
            elif b not in NOT_UTF8:
                return f"byte 0x{b:02x} is not in the vocabulary"
            to_id.append(vocab.get(c, -1))
        for merge in spec["model"].get("merges") or []:
            left, right = merge.split(" ") if isinstance(merge, str) else merge
            if any(t not in vocab_bytes for t in (left, right, left + right)):
                return f"merge {left!r} + {right!r} makes or uses an added token"
            made = to_bytes(left + right)
            if made in ranks:
                return f"two merges make the token {left + right!r}"
            ranks[made] = len(to_id)
            to_id.append(vocab[left + right])
        self._to_id = np.array(to_id, dtype=np.int64)  # tiktoken rank -> our id
        self._bytes = {i: to_bytes(t) for t, i in vocab_bytes.items()}
        self._bytes.update({t["id"]: t["content"].encode("utf-8") for t in added})
        self._nfc = bool(spec.get("normalizer"))
        self._enc = tiktoken.Encoding(name=f"bpe:{self.fingerprint[:12]}", pat_str=GPT2_PATTERN,
                                      mergeable_ranks=ranks, special_tokens={})
        # added tokens, longest first: Python's regex takes the first alternative that matches at
        # the leftmost position, so this is leftmost-longest matching
        by_kind = [sorted((t["content"] for t in added
                           if t.get("normalized", not t.get("special")) == norm),
                          key=len, reverse=True) for norm in (False, True)]
        self._split = [re.compile("(" + "|".join(map(re.escape, c)) + ")") if c else None
                       for c in by_kind]
        return None

    def encode(self, text, normalized=False):
        """As tokenizers does: the added tokens split off first, the normalized ones after NFC."""
        if self._hf is not None:
            return self._hf.encode(text, add_special_tokens=False).ids
        if normalized and self._nfc:
            text = unicodedata.normalize("NFC", text)
        split, ids = self._split[normalized], []
        for i, piece in enumerate(split.split(text) if split else [text]):
            if i % 2:
                ids.append(self.added[piece])
            elif piece and normalized:
                ids.extend(self._to_id[self._enc.encode_ordinary(piece)].tolist())
            elif piece:
                ids.extend(self.encode(piece, normalized=True))
        return ids

    def decode(self, ids):
        """Special tokens are kept as text; an id no token has is dropped (Tokenizer's ids)."""
        if self._hf is not None:
            return self._hf.decode(ids, skip_special_tokens=False)
        return b"".join(self._bytes.get(i, b"") for i in ids).decode("utf-8", errors="replace")


class GPT2:
    """tiktoken's GPT-2 BPE, with the same calls as ByteLevelBPE."""

    def __init__(self, encoding="gpt2"):
        try:
            import tiktoken  # lazily: char-level users never need it
            self._enc = tiktoken.get_encoding(encoding)
        except Exception as e:
            reason = " ".join(f"{type(e).__name__}: {e}".split())[:160]  # long, or many lines
            raise DataError(f"the GPT-2 vocabulary could not be loaded ({reason}); tiktoken "
                            "downloads it once, so offline set TIKTOKEN_CACHE_DIR to a folder "
                            "holding tiktoken's cached files") from None
        self.encoding = encoding
        self.vocab_size = self._enc.n_vocab
        self.eot_id = self._enc.eot_token

    def to_meta(self):
        return {"tokenizer": "gpt2", "encoding": self.encoding}

    def encode(self, text):
        return self._enc.encode(text, allowed_special={"<|endoftext|>"})

    def decode(self, ids):  # Tokenizer's: ids of the vocabulary
        return self._enc.decode(ids)
