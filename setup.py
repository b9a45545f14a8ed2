"""Build configuration beyond pyproject.toml: the optional C record walker.

``samsa.protocol._records`` (protocol/_records.c) speeds up the check of client batches
whose records change sizes; ``optional=True`` lets an install without a C compiler or
Python headers go on without it (protocol/record_check.py then reads records with numpy).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "samsa.protocol._records",
            sources=["src/samsa/protocol/_records.c"],
            optional=True,
        )
    ]
)
