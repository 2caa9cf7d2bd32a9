"""Collectives on point-to-point: argument checks, algorithms, their costs, reduce ops."""
