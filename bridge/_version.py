"""The version of oam-bridge, in one place: the package, initialize's result and recordings read it."""

__version__ = "0.1.0"
