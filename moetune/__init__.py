"""moetune: profile, tune and serve Mixture-of-Experts models.

Nothing is imported here on purpose: `moetune --help` must stay instant.
"""

__version__ = "0.1.0"
