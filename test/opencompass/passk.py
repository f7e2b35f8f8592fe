"""OpenCompass's own pass@k, G-Pass@k and mG-Pass@k on generated cases: the oracle for the
opencompass mode's stability numbers (aggregator/suite, TestOpenCompassPassKOracle).

It loads opencompass/openicl/icl_evaluator/icl_base_evaluator.py from the installed `opencompass`
package (PyPI, installed without dependencies by test/pyenv.sh) with its real numpy and SciPy
(hypergeom), stubbing only the imports those functions do not use: datasets (a type),
opencompass.registry (post-processors) and opencompass.utils.logging. It writes
  - "cases": compute_pass_at_k, compute_g_pass_at_k at each threshold and compute_mg_pass_at_k for
    a grid of (n, c, k), k above n included;
  - "versions": generated versions (cases × n runs, each pass, fail or error) run through
    BaseEvaluator.evaluate itself — n replicas, a score() whose details carry `correct` (an errored
    run is not correct: OpenCompass has no error) — with its reported G-Pass@k and mG-Pass@k means,
    and the mean of compute_pass_at_k over the cases.

usage: python passk.py OUT.json
"""
import importlib.util
import json
import logging
import random
import sys
import types
from pathlib import Path

import opencompass

THRESHOLDS = [0.0, 0.25, 0.5, 0.75, 1.0]


def load_evaluator():
    ds = types.ModuleType("datasets")

    class Dataset:  # only isinstance() checks; the versions below pass lists
        pass

    ds.Dataset = ds.DatasetDict = Dataset
    sys.modules["datasets"] = ds
    reg = types.ModuleType("opencompass.registry")
    reg.TEXT_POSTPROCESSORS = None
    sys.modules["opencompass.registry"] = reg
    utils = types.ModuleType("opencompass.utils")
    utils.__path__ = []
    log = types.ModuleType("opencompass.utils.logging")
    log.get_logger = lambda *a, **k: logging.getLogger("passk")
    sys.modules["opencompass.utils"] = utils
    sys.modules["opencompass.utils.logging"] = log
    path = Path(opencompass.__file__).parent / "openicl" / "icl_evaluator" / "icl_base_evaluator.py"
    spec = importlib.util.spec_from_file_location("opencompass.openicl.icl_evaluator.icl_base_evaluator", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    mod = load_evaluator()
    taus = THRESHOLDS + [0.1, 0.3, 0.7, 0.9]  # 10 × 0.7 = 7.000000000000001: ⌈⌉ gives 8
    cases = []
    ns = list(range(0, 41)) + [64, 100, 257, 1000]
    ks = [1, 2, 3, 4, 5, 7, 8, 10, 16, 20, 32, 50, 100]
    r = random.Random(13)
    for n in ns:
        cs = range(n + 1) if n <= 40 else sorted({0, 1, 2, n // 3, n // 2, n - 2, n - 1, n} | {r.randint(0, n) for _ in range(6)})
        for c in cs:
            for k in ks:
                cases.append({
                    "n": n, "c": c, "k": k,
                    "pass_at_k": float(mod.compute_pass_at_k(n, c, k)),
                    "g_pass_at_k": [float(mod.compute_g_pass_at_k(n, c, k, t)) for t in taus],
                    "mg_pass_at_k": float(mod.compute_mg_pass_at_k(n, c, k)),
                })

    class Replayed(mod.BaseEvaluator):
        """Scores one replica: its runs' results, in dataset order."""

        def score(self, predictions, references):
            details = [{"pred": p, "correct": p == "pass"} for p in predictions]
            return {"accuracy": 100.0 * sum(d["correct"] for d in details) / len(details), "details": details}

    versions = []
    k_list = [1, 2, 4, 5, 8, 10, 16]
    for seed in range(40):
        vr = random.Random(seed)
        n = vr.choice([2, 3, 4, 5, 8, 10, 16])
        m = vr.randint(1, 60)
        p_pass, p_err = vr.random(), vr.choice([0, 0, 0.05, 0.3])
        # results[case][run]
        results = [[("error" if vr.random() < p_err else "pass" if vr.random() < p_pass else "fail") for _ in range(n)]
                   for _ in range(m)]
        # OpenCompass's n replicas of the dataset, replica-major.
        preds = [results[i][rep] for rep in range(n) for i in range(m)]
        dataset = [{"subdivision": "s", "idx": i} for _ in range(n) for i in range(m)]
        out = Replayed().evaluate(k=k_list, n=n, original_dataset=dataset, predictions=preds, references=preds)
        reported = {key: float(v) for key, v in out.items() if key.startswith(("G-Pass@", "mG-Pass@"))}
        pass_at_k = {}
        for k in k_list:
            vals = [mod.compute_pass_at_k(n, sum(x == "pass" for x in row), k) for row in results]
            pass_at_k[str(k)] = 100.0 * float(sum(vals) / len(vals))
        versions.append({"n": n, "ks": k_list, "results": results, "reported": reported, "pass_at_k": pass_at_k})
    doc = {"opencompass": opencompass.__version__, "taus": taus, "cases": cases, "versions": versions}
    Path(sys.argv[1]).write_text(json.dumps(doc))


if __name__ == "__main__":
    main()
