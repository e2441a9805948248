"""The shelf app's ``Item`` as a Django model: a Django project on the same service (the ``django`` extra).

``INSTALLED_APPS = ["estafeta.django", "examples.shelf_django"]``; the table is the shelf
service's, made by ``estafeta migrate`` (the model is unmanaged: Django's migrations leave it alone).
``views`` places items, ``steps`` restocks them through the ORM on the step's own transaction
(``dramatiq examples.shelf_django.worker``), ``settings`` and ``urls`` make it a project.
"""
