"""Problems a handler reports by raising, because they surface deep in a manifest builder."""


class NeedsFix(ValueError):
    """Something the user must fix (the spec, or what it names) before the phase can go on: decide() shows it as a
    Blocked status naming the field, in tests as in the operator. Any other exception from a handler is a bug."""
