"""Makes Inspect AI eval logs for the importer test (importer, TestInspectLogs): a real Inspect AI
run (PyPI inspect-ai) of a small in-memory dataset on its built-in mock model, mockllm/model,
which needs no network, with 3 epochs, written in both log formats (.eval and .json), plus a run
whose every sample errors, one eval() of two models (two logs with one run id: models/), and a
log scored again with a stricter scorer (rescored/: the log as run, then as inspect_ai.score
overwrote it). The mock model's replies are scripted (answer), and the includes() scorer grades
them C or I by the target. Idempotent: makes only the parts OUT does not hold yet.

usage: python make_logs.py OUT_DIR
"""
import sys
from pathlib import Path

out = Path(sys.argv[1])
if (out / "done").exists() and (out / "models").exists() and (out / "rescored" / "edited").exists() and (out / "v1").exists():
    sys.exit(0)

from inspect_ai import Task, eval as inspect_eval, score as inspect_score
from inspect_ai.log import edit_score, read_eval_log, write_eval_log
from inspect_ai.scorer import ScoreEdit
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import exact, includes
from inspect_ai.solver import generate, solver

calls = {}


def answer(messages, tools, tool_choice, config):
    """The mock model's replies: refund-1 always right, refund-3 always wrong, refund-2 right on
    its first call only. Usage is set so that mockllm does not count tokens with tiktoken (whose
    encoding files it would download)."""
    question = messages[-1].text
    n = calls[question] = calls.get(question, 0) + 1
    text = {"What is the default output?": "Default output, as always.",
            "Say something else.": "something else" if n == 1 else "the same thing",
            "Which model answers?": "I cannot say."}[question]
    out = ModelOutput.from_content(model="mockllm", content=text)
    out.usage = ModelUsage(input_tokens=5, output_tokens=5, total_tokens=10)
    return out


samples = [
    Sample(id="refund-1", input="What is the default output?", target="Default output"),
    Sample(id="refund-2", input="Say something else.", target="something else"),
    Sample(id="refund-3", input="Which model answers?", target="mockllm"),
]


@solver
def explode():
    async def solve(state, generate):
        raise RuntimeError("tool crashed")
    return solve


if not (out / "done").exists():
    for fmt in ("eval", "json"):
        calls.clear()
        inspect_eval(Task(name="regressions", dataset=MemoryDataset(samples), solver=generate(), scorer=includes()),
                     model=get_model("mockllm/model", custom_outputs=answer), epochs=3, log_dir=str(out / fmt), log_format=fmt, display="none")
    inspect_eval(Task(name="broken", dataset=MemoryDataset(samples[:2]), solver=explode(), scorer=includes()),
                 model=get_model("mockllm/model", custom_outputs=answer), epochs=2, log_dir=str(out / "error"), log_format="json", display="none",
                 fail_on_error=False)
    (out / "done").write_text("ok\n")

if not (out / "models").exists():
    # One eval() of two models: "other" answers refund-2 wrong from its first call.
    def other(messages, tools, tool_choice, config):
        if messages[-1].text == "Say something else.":
            o = ModelOutput.from_content(model="mockllm", content="the same thing")
            o.usage = ModelUsage(input_tokens=5, output_tokens=5, total_tokens=10)
            return o
        return answer(messages, tools, tool_choice, config)
    calls.clear()
    inspect_eval(Task(name="regressions", dataset=MemoryDataset(samples), solver=generate(), scorer=includes()),
                 model=[get_model("mockllm/model", custom_outputs=answer), get_model("mockllm/other", custom_outputs=other)],
                 epochs=2, log_dir=str(out / "models"), log_format="json", display="none")

if not (out / "rescored" / "again").exists():
    # Scored again with exact(): the verdict of refund-1 ("Default output, as always." against
    # "Default output") turns from C to I in every epoch.
    calls.clear()
    log = inspect_eval(Task(name="regressions", dataset=MemoryDataset(samples), solver=generate(), scorer=includes()),
                       model=get_model("mockllm/model", custom_outputs=answer), epochs=2, log_dir=str(out / "rescored" / "first"),
                       log_format="json", display="none")[0]
    again = inspect_score(log, exact(), action="overwrite")
    (out / "rescored" / "again").mkdir(parents=True)
    write_eval_log(again, str(out / "rescored" / "again" / Path(log.location).name))

if not (out / "rescored" / "edited").exists():
    # The first log with one verdict edited by hand (edit_score): refund-3's first epoch, I → C.
    first = next((out / "rescored" / "first").glob("*.json"))
    log = read_eval_log(str(first))
    edit_score(log, "refund-3", "includes", ScoreEdit(value="C", explanation="a reviewer accepts it"), epoch=1)
    (out / "rescored" / "edited").mkdir(parents=True)
    write_eval_log(log, str(out / "rescored" / "edited" / first.name))

if not (out / "v1").exists():
    # The json/ log in the version-1 layout Inspect still reads (inspect_ai/log/_log.py,
    # EvalSample.migrate_deprecated and EvalLog.populate_scorer_name_for_samples): each sample's one
    # "score" instead of "scores", its events under "transcript", no eval.scorers (the scorer is
    # named by results.scores). Inspect's reader must take it and find the same verdicts.
    import json
    src = next((out / "json").glob("*.json"))
    log = json.loads(src.read_text())
    log["version"] = 1
    log["eval"].pop("scorers", None)
    for sample in log["samples"]:
        scores = sample.pop("scores")
        sample["score"] = next(iter(scores.values()))
        sample["transcript"] = {"events": sample.pop("events"), "content": sample.pop("attachments", {})}
        sample.pop("events_data", None)
    (out / "v1").mkdir()
    dst = out / "v1" / src.name
    dst.write_text(json.dumps(log))
    again = read_eval_log(str(dst))
    first = read_eval_log(str(src))
    assert [s.scores["includes"].value for s in again.samples] == [s.scores["includes"].value for s in first.samples], "Inspect reads the v1 log otherwise"
