"""Promotion: the cost ledger (cost.py) and the pure promotion gate (gate.py)."""
