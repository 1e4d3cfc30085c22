"""Tibetan text: normalisation, syllables, sentence split, corpus preparation, vocabulary.

No torch here: this layer is usable (and tested) without the training stack.
"""
