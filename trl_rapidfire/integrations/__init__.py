"""Integrations with optional libraries (imported only when used).

May import: any layer below ``engine``.
"""
