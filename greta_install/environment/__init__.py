"""The target environment: find its interpreter and package tools, know where a wheel's
files land, write and read GRETA's environment fixes, compile bytecode.

Below the locks (a lock's `[env]` entries are checked by envfix's rules) and above the
foundation modules only.
"""
