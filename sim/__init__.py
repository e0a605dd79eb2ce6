"""phonesim: a discrete-event simulator of phones running sparse LLM inference."""

__version__ = "0.1.0"
