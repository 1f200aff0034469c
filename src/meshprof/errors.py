"""The project's one exception type for errors a user can cause."""

from __future__ import annotations


class MeshprofError(Exception):
    """Bad input from the user (CLI arguments, files, layouts, configuration).

    The message names the thing that is wrong and how to fix it. The CLI prints it as one line
    on stderr and exits with code 2.
    """
