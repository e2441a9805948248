"""The ASGI app ``estafeta serve`` runs (:mod:`estafeta_console.server.web`) and who may sign in to the console.

:mod:`estafeta_console.server.sign_in` slows, then locks out, a client that keeps giving wrong operator
passwords, and signs the notices an action leaves.
"""
