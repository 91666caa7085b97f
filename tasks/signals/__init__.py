"""Production signals: drift statistics over streamed trace windows."""
