"""OpenCompass's own length gate on one benchmark's replies: the oracle for reply_tokens
(OpenCompass's res_length) in `--suite-reply-mode opencompass` (aggregator/suite,
TestOpenCompassGateTakesResLength).

The replies of one model form one benchmark; _analyze_benchmark takes a reply's res_length as its
length when it has one (and tokenizes it otherwise, with Python's str.split() as oracle.py does),
gates on the 75th percentile of those lengths, and _build_abnormal_samples lists the abnormal
replies at or above it.

usage: python gate.py IN.json OUT.json   (IN: [{"text", "res_length"}]; OUT: {"mean", "p75", "p90",
"abnormal"}, abnormal = the distinct replies listed as abnormal of any kind)
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from oracle import WhitespaceEncoding, load_analysis  # noqa: E402


def main():
    mod = load_analysis()
    tok = mod.TokenizerWrapper(WhitespaceEncoding(), "tiktoken", "whitespace")
    recs = [{"model": "m", "benchmark": "b", "sample_id": str(i), "prediction_path": "", "text": r["text"],
             "res_length": r["res_length"]} for i, r in enumerate(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8")))]
    stats = mod._analyze_benchmark(recs, {"m": tok})
    ab = mod._build_abnormal_samples(recs, {"b": stats})
    ids = {s["sample_id"] for kind in ab.values() for s in kind}
    length = stats["length"]
    out = {"mean": length["mean"], "p75": length["p75"], "p90": length["p90"], "abnormal": len(ids)}
    Path(sys.argv[2]).write_text(json.dumps(out), encoding="utf-8")


if __name__ == "__main__":
    main()
