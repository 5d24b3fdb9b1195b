"""Pure parsers, one module per evidence source.

Each module exposes ``parse(text) -> Parsed[Record]``: it never raises, keeps every
record it could read and lists what it could not read in ``problems``. Detection
decides what a problem means for the machine; the parsers only report.
"""
