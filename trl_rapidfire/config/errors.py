"""The error an RF config raises when one of its fields is set wrongly."""

__all__ = ["RFConfigError"]


class RFConfigError(ValueError):
    """An RF config field was set wrongly. The message names the field and the fix."""

    # Users import it from trl_rapidfire.config.configs (or the package); tracebacks name it there.
    __module__ = "trl_rapidfire.config.configs"
