"""Serving: the requests a serving job recorded, their latencies as ``vllm bench serve``
measures them, and the forwards (prefill and decode steps) explained across ranks.

Pure functions over a loaded run returning typed results (:mod:`.types`): the request table
(:mod:`.request_table`), latency distributions and goodput (:mod:`.latency`), the serving steps
and their kinds (:mod:`.step_kinds`), each rank's compute, transfer and wait per step
(:mod:`.rank_breakdown`), what a slow rank costs the requests (:mod:`.request_savings`), the
slowest requests' timelines (:mod:`.slow_requests`) and the findings (:mod:`.serving_findings`).
The intervals are defined once, in docs/definitions.md (Serving).
"""
