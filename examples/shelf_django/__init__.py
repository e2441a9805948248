"""The shelf app's ``Item`` as a Django model: a Django project on the same service (the ``django`` extra).

``INSTALLED_APPS = ["estafeta.django", "examples.shelf_django"]``; the table is the shelf
service's, made by ``estafeta migrate`` (the model is unmanaged: Django's migrations leave it alone).
"""
