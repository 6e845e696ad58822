"""Factuality evaluation: text analysis (sentences, words), scorers and their measured quality, the evaluation of
variants and the λ study, translation, the paper's indicator table."""
