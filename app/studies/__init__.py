"""Measurement code of app/: the dashboard's pages on a large database (`pages`). Run by hand;
nothing at run time imports it. May import app and db.
"""
