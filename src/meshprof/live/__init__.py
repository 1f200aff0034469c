"""Live monitoring of a running job from outside it: the launcher's alert watcher
(:mod:`.watch`), the Prometheus exporter (:mod:`.metrics`) and ``meshprof serve``'s dashboard
server (:mod:`.server`). The ranks publish their state from :mod:`meshprof.session.live_publish`;
its records are :mod:`meshprof.records.live`, its files :mod:`meshprof.rundir.live`."""
