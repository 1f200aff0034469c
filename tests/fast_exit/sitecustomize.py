"""Every Python process the test suite starts imports this first (``tests/conftest.py`` puts
this folder on ``PYTHONPATH``; the compatibility cells' processes do not get it).

At exit, after every other ``atexit`` callback (this one is registered first, and they run last
in, first out), it freezes the garbage collector: the interpreter's teardown then skips its
cyclic collections over every object the process made. Those collections cost a process that
imported torch about 0.33 CPU s of its ~1.5; a trivial 2-rank ``meshprof run`` takes 0.80 of
its CPU with this (benchmarks/README.md, "Sixth step"). Nothing the process computed or
wrote changes: the callbacks (meshprof's last writes among them) have run, and objects are still
freed when their last reference goes; only garbage in reference cycles is left to the OS."""

import atexit
import gc

atexit.register(gc.freeze)
