"""The conclusions: the time ledger, the verdict, the findings, the bottlenecks and the report's tables drawn from the other rooms."""
