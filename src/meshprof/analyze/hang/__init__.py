"""Hang diagnosis from the watchdog's and the Flight Recorder's dumps."""
