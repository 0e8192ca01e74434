"""Gates that read the arms' production telemetry, interval by interval, and what they read."""
