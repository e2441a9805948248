"""The ASGI app ``estafeta serve`` runs (:mod:`console.server.web`) and who may sign in to the console.

:mod:`console.server.sign_in` slows, then locks out, a client that keeps giving wrong operator
passwords, and signs the notices an action leaves.
"""
