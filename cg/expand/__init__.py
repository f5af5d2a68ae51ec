"""expand"""
