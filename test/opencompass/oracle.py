"""OpenCompass's own repeat analysis on a generated corpus of replies: the oracle for
`--suite-reply-mode opencompass` (aggregator/suite, TestOpenCompassOracle).

It loads opencompass/utils/repeat_analysis.py from the installed `opencompass` package (PyPI,
installed without dependencies by test/pyenv.sh) and stubs only the imports that the analysis of
predictions does not use: mmengine (config and progress bar types) and opencompass.utils.abbr
(output paths). numpy, which the analysis uses, is the real one. Each reply is analysed alone as
one benchmark by _analyze_benchmark (so it is its own 75th percentile, a candidate) with a
whitespace tokenizer (Python's str.split()), and judged by _build_abnormal_samples.

usage: python oracle.py OUT.json   (writes {"space": [...], "replies": [{"text", ...}]})
"""
import importlib.util
import json
import random
import sys
import types
from pathlib import Path

import opencompass


def load_analysis():
    mm = types.ModuleType("mmengine")
    mm.ConfigDict = dict
    mm.ProgressBar = object
    sys.modules["mmengine"] = mm
    utils = types.ModuleType("opencompass.utils")
    utils.__path__ = []
    abbr = types.ModuleType("opencompass.utils.abbr")
    for name in ("dataset_abbr_from_cfg", "get_infer_output_path", "model_abbr_from_cfg"):
        setattr(abbr, name, lambda *a, **k: "unused")
    sys.modules["opencompass.utils"] = utils
    sys.modules["opencompass.utils.abbr"] = abbr
    path = Path(opencompass.__file__).parent / "utils" / "repeat_analysis.py"
    spec = importlib.util.spec_from_file_location("opencompass.utils.repeat_analysis", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class WhitespaceEncoding:
    """A tiktoken-shaped tokenizer whose tokens are str.split()'s words."""

    def __init__(self):
        self.vocab, self.words = {}, []

    def _id(self, w):
        if w not in self.vocab:
            self.vocab[w] = len(self.words)
            self.words.append(w)
        return self.vocab[w]

    def encode(self, text, disallowed_special=()):
        return [self._id(w) for w in text.split()]

    def encode_batch(self, texts, disallowed_special=()):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


SPACES = [chr(c) for c in range(0x110000) if chr(c).isspace()]
WORDS = ["the", "answer", "is", "42", "loop", "again", "x", "é", "数学", "🙂", "a", "bb", "ok,", "step"]


def corpus(seed=13, n=3000):
    r = random.Random(seed)
    out = []

    def seps(k):
        pool = [" "] * 8 + ["\n", "\t"] + SPACES
        return [r.choice(pool) for _ in range(k)]

    def join(words):
        s = seps(len(words))
        return "".join(w + s[i] for i, w in enumerate(words))

    for i in range(n):
        kind = i % 8
        if kind == 0:  # prose-like: no repetition
            words = [r.choice(WORDS) + str(r.randint(0, 999)) for _ in range(r.randint(0, 400))]
        elif kind == 1:  # a loop of a 32-token-ish pattern, near the count threshold
            period = r.choice([1, 2, 3, 8, 16, 31, 32, 33, 40])
            pat = [r.choice(WORDS) + str(r.randint(0, 9)) for _ in range(period)]
            reps = r.randint(1, 60)
            pre = [r.choice(WORDS) + str(r.randint(0, 99)) for _ in range(r.randint(0, 300))]
            words = pre + pat * reps
        elif kind == 2:  # a loop with uneven gaps: a noise word now and then
            period = r.choice([8, 16, 32, 40])
            pat = [r.choice(WORDS) for _ in range(period)]
            words = [r.choice(WORDS) for _ in range(r.randint(0, 200))]
            for _ in range(r.randint(15, 70)):
                words += pat
                if r.random() < r.choice([0.02, 0.05, 0.1, 0.3]):
                    words += [r.choice(WORDS) for _ in range(r.randint(1, 3))]
        elif kind == 3:  # short replies, around 64 and 128 tokens
            words = [r.choice(WORDS) for _ in range(r.choice([0, 1, 31, 63, 64, 65, 127, 128, 129, 130]))]
        elif kind == 4:  # one token repeated: every window matches everywhere
            words = [r.choice(WORDS)] * r.randint(60, 900) + [r.choice(WORDS) for _ in range(r.randint(0, 40))]
        elif kind == 5:  # compressible text near the gzip threshold (ratio 40 of the second half)
            unit = r.choice(["ab", "abc ", "the answer is 42. ", "x" * r.randint(1, 50), "数学 "])
            text = unit * r.randint(50, 3000)
            text += "".join(r.choice("abcdefghij \n") for _ in range(r.randint(0, 400)))
            out.append(text)
            continue
        elif kind == 6:  # random bytes as text and long multi-block inputs
            k = r.choice([10, 1000, 40000, 70000])
            text = "".join(chr(r.choice([r.randint(32, 126), r.randint(0xa0, 0x2fff), 0x1c, 0x1f, 0x85])) for _ in range(k))
            out.append(text)
            continue
        else:  # two interleaved loops, the second starting late
            a = [r.choice(WORDS) for _ in range(32)]
            b = [r.choice(WORDS) for _ in range(r.choice([5, 32, 33]))]
            words = a * r.randint(5, 30) + b * r.randint(10, 50)
        out.append(join(words))
    return out


def main():
    mod = load_analysis()
    tok = mod.TokenizerWrapper(WhitespaceEncoding(), "tiktoken", "whitespace")
    rows = []
    for text in corpus():
        rec = {"model": "m", "benchmark": "b", "sample_id": "0", "prediction_path": "", "text": text, "res_length": None}
        stats = mod._analyze_benchmark([rec], {"m": tok})
        ab = mod._build_abnormal_samples([rec], {"b": stats})
        rows.append({
            "text": text,
            "length": rec["length"],
            "skipped": rec["repeat_analysis_skipped"],
            "count": rec["repeat_pattern_count"],
            "ratio": rec["repeat_pattern_ratio"],
            "pattern": rec["repeat_pattern"],
            "gzip": rec["gzip_compression_ratio"],
            "repeat_pattern": len(ab["repeat_pattern"]) == 1,
            "gzip_high_compression": len(ab["gzip_high_compression"]) == 1,
        })
    doc = {"opencompass": opencompass.__version__, "space": [ord(c) for c in SPACES], "replies": rows}
    Path(sys.argv[1]).write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
