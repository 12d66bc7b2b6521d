"""switchyard: admission."""
