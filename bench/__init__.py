"""switchyard: bench."""
