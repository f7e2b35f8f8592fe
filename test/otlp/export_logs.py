"""Exports log records to repeatrate's OTLP logs endpoint with the OpenTelemetry Python SDK and
its OTLP/HTTP exporter (protobuf), as a production service would: the scope on the resource, each
attempt's or eval result's fields as log attributes (docs/feeding.md#opentelemetry).

Usage: python export_logs.py ENDPOINT TOKEN WORKSPACE N
Sends N live attempts of correction fix-otel (every fourth a confirmed repeat) and one eval
result whose body is the model's reply, then prints how many it handed to the exporter and the
export's result.
"""
import logging
import sys

from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource

endpoint, token, workspace, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
resource = Resource.create({
    "service.name": "support-bot",
    "repeatrate.workspace": workspace,
    "repeatrate.model": "support-bot",
    "repeatrate.run": "prod",
    "repeatrate.checkpoint": "v2",
    "repeatrate.artifact": "chat",
})
exporter = OTLPLogExporter(endpoint=endpoint, headers={"Authorization": "Bearer " + token})
provider = LoggerProvider(resource=resource)
provider.add_log_record_processor(BatchLogRecordProcessor(exporter, max_export_batch_size=512))
log = logging.getLogger("repeatrate-otel-test")
log.addHandler(LoggingHandler(level=logging.INFO, logger_provider=provider))
log.setLevel(logging.INFO)
log.propagate = False

for i in range(n):
    log.info("attempt", extra={
        "repeatrate.correction_id": "fix-otel",
        "repeatrate.opportunity_id": "otel-%d" % i,
        "repeatrate.outcome": "confirmed_repeat" if i % 4 == 0 else "passed",
    })
log.info("The refund window is thirty days.", extra={
    "repeatrate.suite": "qa-otel", "repeatrate.case_id": "case-1", "repeatrate.version": "v1",
    "repeatrate.version_seq": 1, "repeatrate.run_index": 0, "repeatrate.runs": 1, "repeatrate.result": "pass",
})
ok = provider.force_flush(30000)
provider.shutdown()
print("handed %d records; flushed %s" % (n + 1, ok))
