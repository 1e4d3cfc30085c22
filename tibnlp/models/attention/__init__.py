"""Attention designs behind one interface, selected by configuration."""
