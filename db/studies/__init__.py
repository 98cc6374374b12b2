"""Measurement code of db/: pages reading while writers write (`load`) and the synthetic large
database the dashboard's page benchmark reads (`synthetic`). Run by hand; nothing at run time
imports them. May import db (and run the real command line as processes).
"""
