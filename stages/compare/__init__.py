"""Comparators, apart from the runners: a candidate's outputs against the reference's, whatever ran them."""
