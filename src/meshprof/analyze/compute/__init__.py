"""Shared compute helpers of the analyses: interval unions, sorting, heap release, plain dicts, the pipeline bubble's measure."""
