"""backup"""
