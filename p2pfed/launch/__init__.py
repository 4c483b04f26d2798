"""Launchers: start mesh members (one per process or many in one), coordinators and scripted scenario runs."""
