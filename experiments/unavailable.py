"""Why a system has no figure in a row."""


class Unavailable(Exception):
    """A system that cannot run here; the message is the reason shown in its row."""
