"""The optional coordinator: runs the centralized methods over the mesh (server.py)."""
