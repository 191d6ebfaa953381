"""Drafters: everything that proposes tokens for the target to verify.

``base`` holds the interface every drafter shares; each other module is one
drafter; ``registry`` maps method names to factories and is imported only by
the engine (drafters never import it, nor the engine).
"""
