"""switchyard: backends."""
