"""Scheduling plugins as objects (base.py): each filter, scorer and picker of the catalogue is
one, built once per scheduler, holding whatever state it learns from the lifecycle hooks."""
