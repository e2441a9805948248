"""``shelf.items`` as a Django model (unmanaged: ``estafeta migrate`` owns the shelf schema)."""

from __future__ import annotations

from django.db import models


class Item(models.Model):
    """A row of ``shelf.items``."""

    item_id = models.UUIDField(primary_key=True)
    name = models.TextField(unique=True)
    quantity = models.IntegerField(default=0)

    class Meta:
        managed = False
        # The service's schema: PostgreSQL reads this quoted name as "shelf"."items".
        db_table = 'shelf"."items'
