"""Oracle of the text OpenCompass makes of a prediction (importer, TestOpenCompassPredictionText):
the function _prediction_to_text of opencompass/utils/repeat_analysis.py, taken from the installed
`opencompass` package's source with ast and run as it is (the module's other imports, mmengine and
numpy among them, are not needed by it). Reads a JSON list of predictions from IN and writes the
list of their texts to OUT, with the OpenCompass version.

usage: python prediction_text.py IN OUT
"""
import ast
import json
import sys
from pathlib import Path
from typing import Any

import opencompass


def load():
    path = Path(opencompass.__file__).parent / "utils" / "repeat_analysis.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_prediction_to_text")
    ns = {"json": json, "Any": Any}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), ns)
    return ns["_prediction_to_text"]


def main():
    to_text = load()
    preds = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps({"opencompass": opencompass.__version__, "texts": [to_text(p) for p in preds]}))


if __name__ == "__main__":
    main()
