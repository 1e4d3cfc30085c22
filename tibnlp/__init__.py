"""tibnlp: Tibetan NLP from raw text to a pretrained encoder and a measured downstream result."""

__version__ = "0.1.0"
