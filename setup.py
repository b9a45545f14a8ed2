"""Build configuration beyond pyproject.toml: the optional C record reader.

``samsa.protocol._records`` (protocol/_records.c) speeds up the check of client batches
whose records change sizes, and makes the consumer's ConsumerRecords from fetched batches;
``optional=True`` lets an install without a C compiler or Python headers go on without it
(protocol/record_check.py then reads records with numpy, client/_fetcher.py decodes them
column-wise and makes the records in Python).
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
