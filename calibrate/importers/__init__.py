"""Importers: convert public reference data into kernelsight's own formats."""
