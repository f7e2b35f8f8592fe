"""Makes Inspect AI eval logs for the importer test (importer, TestInspectLogs): a real Inspect AI
run (PyPI inspect-ai) of a small in-memory dataset on its built-in mock model, mockllm/model,
which needs no network, with 3 epochs, written in both log formats (.eval and .json), plus a run
whose every sample errors. The mock model's replies are scripted (answer), and the includes()
scorer grades them C or I by the target. Idempotent: does nothing when OUT already holds the logs.

usage: python make_logs.py OUT_DIR
"""
import sys
from pathlib import Path

out = Path(sys.argv[1])
if (out / "done").exists():
    sys.exit(0)

from inspect_ai import Task, eval as inspect_eval
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
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


for fmt in ("eval", "json"):
    calls.clear()
    inspect_eval(Task(name="regressions", dataset=MemoryDataset(samples), solver=generate(), scorer=includes()),
                 model=get_model("mockllm/model", custom_outputs=answer), epochs=3, log_dir=str(out / fmt), log_format=fmt, display="none")
inspect_eval(Task(name="broken", dataset=MemoryDataset(samples[:2]), solver=explode(), scorer=includes()),
             model=get_model("mockllm/model", custom_outputs=answer), epochs=2, log_dir=str(out / "error"), log_format="json", display="none",
             fail_on_error=False)
(out / "done").write_text("ok\n")
