"""The typed records meshprof writes to files and hands between processes, and their one
codec: each record is a frozen dataclass whose fields (with a docstring each) are the JSON keys.
No torch import; every layer may import this package."""
