"""Parses a Prometheus text exposition (stdin) with the reference client
library's parser and prints its families as JSON (stdout):
{name: {"type": ..., "help": ..., "samples": [[name, labels, value], ...]}}.
A parse error exits non-zero. Used by tests/metrics.rs."""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families

families = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    if family.name in families:
        sys.exit(f"family {family.name} appears twice")
    families[family.name] = {
        "type": family.type,
        "help": family.documentation,
        "samples": [[s.name, s.labels, s.value] for s in family.samples],
    }
json.dump(families, sys.stdout)
