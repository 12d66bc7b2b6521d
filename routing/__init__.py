"""switchyard: routing."""
