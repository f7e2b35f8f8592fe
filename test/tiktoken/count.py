"""Python's tiktoken on given texts: the oracle for the suite's tiktoken tokenizers
(aggregator/suite, TestTiktokenMatchesPython).

The encoding files are handed to tiktoken locally: ENC_DIR holds o200k_base.tiktoken and
cl100k_base.tiktoken (the Go test writes the copies embedded in the binary), which this script
places in a private TIKTOKEN_CACHE_DIR under the names tiktoken looks them up by (the SHA-1 of
their download address). tiktoken checks each file against the SHA-256 it expects, and any
attempt to download fails the run: no network is used.

usage: python count.py ENC_DIR TEXTS.json OUT.json
  TEXTS.json: ["text", ...]; OUT.json: {"<encoding>": [{"ids": [...], "tokens": [...]}, ...]}
"""
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import os

ENCODINGS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}


def main():
    enc_dir, texts_path, out_path = map(Path, sys.argv[1:4])
    cache = Path(tempfile.mkdtemp(prefix="tiktoken-cache-"))
    for name, url in ENCODINGS.items():
        shutil.copy(enc_dir / f"{name}.tiktoken", cache / hashlib.sha1(url.encode()).hexdigest())
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)

    import tiktoken
    import tiktoken.load

    def no_network(blobpath):
        raise RuntimeError(f"tiktoken tried to download {blobpath}: the local file is missing or differs")

    tiktoken.load.read_file = no_network
    texts = json.loads(texts_path.read_text(encoding="utf-8"))
    out = {}
    for name in ENCODINGS:
        enc = tiktoken.get_encoding(name)
        rows = []
        for ids in enc.encode_batch(texts, disallowed_special=()):
            rows.append({"ids": ids, "tokens": [enc.decode([t]) for t in ids]})
        out[name] = rows
    out_path.write_text(json.dumps(out, ensure_ascii=False), encoding="utf-8")
    shutil.rmtree(cache)


if __name__ == "__main__":
    main()
