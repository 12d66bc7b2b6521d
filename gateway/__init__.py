"""switchyard: gateway."""
