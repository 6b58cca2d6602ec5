"""Test doubles that speak real protocols on loopback (no cluster or cloud needed)."""
