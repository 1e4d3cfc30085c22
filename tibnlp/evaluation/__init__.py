"""Evaluation: metrics (scikit-learn), reports, plots, leakage and robustness splits."""
