"""Writing tibnlp models in other ecosystems' formats (Hugging Face transformers)."""
