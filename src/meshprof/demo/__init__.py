"""The demo behind ``meshprof demo``: a small transformer (:mod:`.model`), built 3D-parallel with
torch's own engines (:mod:`.build`), its training loop (:mod:`.train`) and the per-rank worker
that trains it in a recording session (:mod:`.worker`). The layout itself lives in
:mod:`meshprof.parallel`."""

from __future__ import annotations
