"""What runs inside the training process under ``meshprof run``, ``@performance_monitor`` and the demo: the recording session, the hang watchdog and the live-state publisher."""
