"""A tiny serving loop for the OTLP serving tests: requests handled one after another through
``meshprof.requests()``, each waiting a planned time to its first token and between tokens
(sleeps: the time a model would compute). The script takes its own ``time.time_ns()`` when it
hands a request to the monitor, after its first token and after it finished, and writes them to
OUT/serving_truth.json: the client-side truth the exported histograms and spans are checked
against. Some requests come with a W3C ``traceparent`` this script makes up (random ids, as a
client's tracer would), one with a malformed one and one with an all-zero trace id (both to be
ignored): the truth says which trace id and parent span id each request's span must have.
argv: out"""

import json
import os
import secrets
import sys
import time

import meshprof

out = sys.argv[1]
# (time to first token s, output tokens, gap between tokens s, finish reason)
PLAN = [
    (0.015, 4, 0.015, "stop"),
    (0.030, 1, 0.0, "stop"),
    (0.050, 6, 0.012, "length"),
    (0.150, 3, 0.030, "stop"),
    (0.015, 2, 0.060, "length"),
    (0.070, 5, 0.020, "stop"),
    (0.030, 2, 0.010, "error"),
    (0.020, 1, 0.0, "abort"),
]
rm = meshprof.requests()
truth = []
for i, (ttft, n, gap, reason) in enumerate(PLAN):
    trace_id, parent_id, header = "", "", None
    if i in (0, 2, 4, 6):  # a client's own trace context (sampled, and one not: 4)
        trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
        header = f"00-{trace_id}-{parent_id}-{'00' if i == 4 else '01'}"
    elif i == 3:
        header = "00-not-a-traceparent-01"
    elif i == 5:
        header = f"00-{'0' * 32}-{secrets.token_hex(8)}-01"  # an invalid (all-zero) trace id
    elif i == 7:  # upper-case hex: invalid (W3C: lowercase only)
        header = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01".upper()
    sent = time.time_ns()
    rid = rm.begin(prompt_tokens=8 + i, traceparent=header)
    rm.scheduled(rid)
    time.sleep(ttft)
    rm.token(rid)
    first = time.time_ns()
    for _ in range(n - 1):
        time.sleep(gap)
        rm.token(rid)
    rm.finish(rid, reason)
    end = time.time_ns()
    truth.append(
        {"id": rid, "sent_ns": sent, "first_ns": first, "end_ns": end, "tokens": n,
         "prompt": 8 + i, "reason": reason, "trace_id": trace_id, "parent_id": parent_id}
    )  # fmt: skip
assert rm.traceparents == 7, rm.traceparents  # (the rank writer parses them)
with open(os.path.join(out, "serving_truth.json"), "w") as f:
    json.dump(truth, f)
