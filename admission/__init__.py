"""switchyard: admission."""

import routing  # noqa: F401  (loads the compiled decision modules when built: routing.native)
